package safefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Outputs a user points at on purpose are written as they are, never
// replaced, truncated or rotated: /dev/null, /dev/stdout and /dev/stderr
// (gaptrace's own), and a FIFO of this user with a reader.

// stdStream is the descriptor a path names when it is /dev/stdout or
// /dev/stderr (or /dev/fd/1, /dev/fd/2), else -1.
func stdStream(path string) int {
	switch filepath.Clean(path) {
	case "/dev/stdout", "/dev/fd/1", "/proc/self/fd/1":
		return 1
	case "/dev/stderr", "/dev/fd/2", "/proc/self/fd/2":
		return 2
	}
	return -1
}

// isDevNull reports whether st is the null device.
func isDevNull(st os.FileInfo) bool {
	s, ok := st.Sys().(*syscall.Stat_t)
	return ok && st.Mode()&os.ModeCharDevice != 0 && unix.Major(s.Rdev) == 1 && unix.Minor(s.Rdev) == 3
}

// Special reports whether path is an output written as it is: standard
// output or error, the null device, or a FIFO.
func Special(path string) bool {
	if stdStream(path) >= 0 {
		return true
	}
	st, err := os.Lstat(path)
	return err == nil && (isDevNull(st) || st.Mode()&os.ModeNamedPipe != 0)
}

// owner refuses a file of another user: gaptrace, often root, never
// truncates or fills a file someone else made (and could then read).
func owner(path string, st os.FileInfo) error {
	s, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if me := uint32(os.Geteuid()); s.Uid != me {
		return fmt.Errorf("%w: %s belongs to uid %d, not to this user (uid %d); refusing to write another user's file, remove it or name another",
			ErrUnsafe, path, s.Uid, me)
	}
	return nil
}

// createSpecial opens an output Special accepts; ok is false for any
// other path.
func createSpecial(path string) (f *os.File, ok bool, err error) {
	if fd := stdStream(path); fd >= 0 {
		d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 3)
		if err != nil {
			return nil, true, &os.PathError{Op: "create", Path: path, Err: err}
		}
		return os.NewFile(uintptr(d), path), true, nil
	}
	st, err := os.Lstat(path)
	if err != nil || (!isDevNull(st) && st.Mode()&os.ModeNamedPipe == 0) {
		return nil, false, nil
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENXIO):
		return nil, true, fmt.Errorf("%w: %s is a FIFO with no reader; start its reader first", ErrUnsafe, path)
	case err != nil:
		return nil, true, &os.PathError{Op: "create", Path: path, Err: err}
	}
	f = os.NewFile(uintptr(fd), path)
	if st, err = f.Stat(); err == nil {
		switch {
		case isDevNull(st):
		case st.Mode()&os.ModeNamedPipe != 0:
			if err = owner(path, st); err == nil {
				err = unix.SetNonblock(fd, false) // the reader sets the pace
			}
		default:
			err = fmt.Errorf("%w: %s changed while it was opened", ErrUnsafe, path)
		}
	}
	if err != nil {
		f.Close()
		return nil, true, err
	}
	return f, true, nil
}

// removeStale removes the temporary files that a run killed before it
// could finish path left behind (.NAME.PID.*.tmp of a PID that is gone,
// or of the older form .NAME.*.tmp), of this user only.
func removeStale(dir, base string) {
	matches, _ := filepath.Glob(filepath.Join(dir, "."+escapeGlob(base)+".*.tmp"))
	me := os.Getpid()
	for _, m := range matches {
		mid := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), "."+base+"."), ".tmp")
		if pid, _, ok := strings.Cut(mid, "."); ok {
			if n, err := strconv.Atoi(pid); err == nil && n != me && alive(n) {
				continue // a live run's: not ours to remove
			}
		}
		st, err := os.Lstat(m)
		if err != nil || !st.Mode().IsRegular() || owner(m, st) != nil {
			continue
		}
		os.Remove(m)
	}
}

// escapeGlob quotes a name's glob characters.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// alive reports whether process pid exists.
func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
