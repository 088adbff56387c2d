package tracer

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// mapping is one executable file mapping of a process.
type mapping struct {
	start, end, off uint64
	dev, ino        uint64
	path            string
	ef              *elfFile // once looked up
}

// mappingOf finds the executable mapping of pid holding addr, reading
// /proc/PID/maps again once when it is not there (a library loaded since).
func (s *symbolizer) mappingOf(pid uint32, addr uint64) (*mapping, bool) {
	for attempt := 0; attempt < 2; attempt++ {
		ms, ok := s.procs[pid]
		if attempt == 1 {
			if inSpans(s.vdso[pid], addr) {
				return nil, false // no reread finds a file there
			}
			// The clock is read on a miss only: every frame of every
			// sample comes through here.
			if since := time.Since(s.readAt[pid]); since < mapsRereadEvery && (!s.changed[pid] || since < mapsRereadChanged) {
				return nil, false
			}
		}
		if !ok || attempt == 1 {
			var err error
			var vdso []span
			ms, vdso, err = readExecMaps(filepath.Join(s.procRoot, strconv.Itoa(int(pid)), "maps"))
			if err != nil {
				return nil, false
			}
			s.procs[pid] = ms
			s.vdso[pid] = vdso
			s.readAt[pid] = time.Now()
			delete(s.changed, pid)
		}
		i := sort.Search(len(ms), func(i int) bool { return ms[i].end > addr })
		if i < len(ms) && ms[i].start <= addr {
			return ms[i], true
		}
	}
	return nil, false
}

// readExecMappings parses the executable file mappings of a maps file,
// sorted by address.
func readExecMappings(path string) ([]*mapping, error) {
	return readMappings(path, parseMapsLine)
}

// span is an address range [start, end).
type span struct{ start, end uint64 }

// inSpans reports whether addr lies in one of sp.
func inSpans(sp []span, addr uint64) bool {
	for _, r := range sp {
		if addr >= r.start && addr < r.end {
			return true
		}
	}
	return false
}

// readExecMaps is readExecMappings, and where the maps place the [vdso]
// and [vsyscall] code.
func readExecMaps(path string) ([]*mapping, []span, error) {
	var vdso []span
	ms, err := readMappings(path, func(line string) (mapping, bool) {
		if m, ok := parseMapsLine(line); ok {
			return m, true
		}
		if r, ok := parseVDSOLine(line); ok {
			vdso = append(vdso, r)
		}
		return mapping{}, false
	})
	return ms, vdso, err
}

// parseVDSOLine parses a maps line of [vdso] or [vsyscall].
func parseVDSOLine(line string) (span, bool) {
	fs := strings.Fields(line)
	if len(fs) != 6 || fs[5] != "[vdso]" && fs[5] != "[vsyscall]" {
		return span{}, false
	}
	lo, hi, ok := strings.Cut(fs[0], "-")
	if !ok {
		return span{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	if err1 != nil || err2 != nil || end <= start {
		return span{}, false
	}
	return span{start, end}, true
}

// readMappings parses the lines of a maps file that parse keeps, sorted by
// address.
func readMappings(path string, parse func(string) (mapping, bool)) ([]*mapping, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open maps: %w", err)
	}
	defer func() { _ = f.Close() }() // read-only
	var out []*mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m, ok := parse(sc.Text()); ok {
			out = append(out, &m)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read maps: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].start < out[j].start })
	return out, nil
}

// parseMapsLine reads "start-end perms offset major:minor inode path" and
// keeps executable mappings of files.
func parseMapsLine(line string) (mapping, bool) { return parseMapping(line, true) }

// parseMapping is parseMapsLine for any mapping of a file ("(deleted)"
// files included) where exec is false.
func parseMapping(line string, exec bool) (mapping, bool) {
	fs := strings.Fields(line)
	if len(fs) < 6 || len(fs[1]) < 3 || exec && fs[1][2] != 'x' || !strings.HasPrefix(fs[5], "/") {
		return mapping{}, false
	}
	lo, hi, ok := strings.Cut(fs[0], "-")
	if !ok {
		return mapping{}, false
	}
	start, err1 := strconv.ParseUint(lo, 16, 64)
	end, err2 := strconv.ParseUint(hi, 16, 64)
	off, err3 := strconv.ParseUint(fs[2], 16, 64)
	ino, err4 := strconv.ParseUint(fs[4], 10, 64)
	maj, min, ok2 := strings.Cut(fs[3], ":")
	ma, err5 := strconv.ParseUint(maj, 16, 32)
	mi, err6 := strconv.ParseUint(min, 16, 32)
	if err := errors.Join(err1, err2, err3, err4, err5, err6); err != nil || !ok2 || end <= start {
		return mapping{}, false
	}
	return mapping{start: start, end: end, off: off, dev: ma<<32 | mi, ino: ino,
		path: strings.Join(fs[5:], " ")}, true
}
