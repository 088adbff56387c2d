package tracer

import (
	"bytes"
	"debug/dwarf"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/ulikunitz/xz"

	"github.com/gaptrace/gaptrace/event"
)

// Limits on what one file's debug data may cost: a MiniDebugInfo section
// decompresses to a symbol table (a few MB for the largest libraries), and
// a line table above maxLineSection (a library built with full debug
// information) is left unread rather than held in memory.
const (
	maxMiniDebug   = 64 << 20
	maxLineSection = 32 << 20
)

// miniDebugELF decompresses the ELF embedded, xz compressed, in e's
// .gnu_debugdata section, and returns it with its bytes.
func miniDebugELF(e *elf.File) (*elf.File, []byte, error) {
	sec := e.Section(".gnu_debugdata")
	if sec == nil {
		return nil, nil, errors.New("no .gnu_debugdata")
	}
	zr, err := xz.NewReader(sec.Open())
	if err != nil {
		return nil, nil, fmt.Errorf(".gnu_debugdata: %w", err)
	}
	b, err := io.ReadAll(io.LimitReader(zr, maxMiniDebug+1))
	if err != nil {
		return nil, nil, fmt.Errorf(".gnu_debugdata: %w", err)
	}
	if len(b) > maxMiniDebug {
		return nil, nil, errors.New(".gnu_debugdata: too large")
	}
	mini, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, nil, fmt.Errorf(".gnu_debugdata: %w", err)
	}
	return mini, b, nil
}

// lineEntry: code from addr up to the next entry's addr is line of file
// (line 0: no line, past the end of a sequence).
type lineEntry struct {
	addr uint64
	file string
	line int
}

// lineWait bounds how long a lookup waits for a file's line table on its
// first use. The table is parsed off the path that reads the ring buffer:
// a binary with full debug information (a Go program's DWARF holds close
// to a million rows, 1.3 s to parse here) would otherwise stop every
// event behind the stack that first named it, the mapping of libcuda
// among them, and the probes would attach a second late. A small table
// (a C trainer's) is ready well within lineWait, so its first stack has
// its lines; a large one's stacks have functions until it is.
const lineWait = 50 * time.Millisecond

// line returns the source file and line of virtual address vaddr from the
// file's DWARF line table, read on first use; 0 when unknown. pending: the
// table is still being read, so a later lookup may know the line.
func (ef *elfFile) line(vaddr uint64) (file string, line int, pending bool) {
	if ef.linesDone == nil {
		ef.linesDone = make(chan struct{})
		if ef.noLines || !ownCode(ef.path) {
			close(ef.linesDone)
		} else {
			go func(e *elf.File, done chan struct{}) {
				ef.lines = readLines(e)
				close(done)
			}(ef.elf, ef.linesDone)
		}
	}
	select {
	case <-ef.linesDone:
	default:
		if ef.waited {
			return "", 0, true
		}
		ef.waited = true
		t := time.NewTimer(lineWait)
		defer t.Stop()
		select {
		case <-ef.linesDone:
		case <-t.C:
			return "", 0, true
		}
	}
	i := sort.Search(len(ef.lines), func(i int) bool { return ef.lines[i].addr > vaddr }) - 1
	if i < 0 {
		return "", 0, false
	}
	return ef.lines[i].file, ef.lines[i].line, false
}

// ownCode: only the job's own binaries have their line tables read. A
// system library or an interpreter built with -g (pyenv builds libpython
// with a 1 MB line table) would cost the first stack through it a parse
// of that table, while its frames are never the ones a gap is charged to
// (correlate.UserFrame asks the same event.SystemCode). A file without a
// mapping's path was opened by name, not found in a process: nothing says
// it is a library's, and its lines are read.
func ownCode(path string) bool {
	return path == "" || !event.SystemCode(path)
}

// readLines flattens the line programs of every compilation unit of e into
// one table sorted by address. Nil without DWARF or when it is too large.
func readLines(e *elf.File) []lineEntry {
	if e == nil {
		return nil
	}
	sec := e.Section(".debug_line")
	if sec == nil || sec.Size > maxLineSection {
		return nil
	}
	d, err := e.DWARF()
	if err != nil {
		return nil
	}
	var out []lineEntry
	r := d.Reader()
	for {
		cu, err := r.Next()
		if err != nil || cu == nil {
			break
		}
		if cu.Tag != dwarf.TagCompileUnit {
			r.SkipChildren()
			continue
		}
		lr, err := d.LineReader(cu)
		r.SkipChildren()
		if err != nil || lr == nil {
			continue
		}
		var le dwarf.LineEntry
		for lr.Next(&le) == nil {
			switch {
			case le.EndSequence:
				out = append(out, lineEntry{addr: le.Address})
			case le.File != nil:
				out = append(out, lineEntry{addr: le.Address, file: le.File.Name, line: le.Line})
			}
		}
	}
	// Stable: at one address the last entry of a row wins (a sequence's
	// end and the next one's start share it; the start must win).
	sort.SliceStable(out, func(i, j int) bool { return out[i].addr < out[j].addr })
	k := 0
	for i := range out {
		if k > 0 && out[k-1].addr == out[i].addr {
			if out[i].line > 0 || out[k-1].line == 0 {
				out[k-1] = out[i]
			}
			continue
		}
		out[k] = out[i]
		k++
	}
	return out[:k]
}
