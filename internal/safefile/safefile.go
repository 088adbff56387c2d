// Package safefile creates gaptrace's output files. gaptrace runs as root
// next to code it does not control, often in a directory that code can
// write to; a path it is told to write may already be a symbolic link, a
// hard link or a FIFO planted there to make root overwrite another file or
// hang. Every output is therefore created without following a final
// symbolic link, refused when it is anything but a regular file with a
// single link, and written with owner-and-group permissions only.
package safefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Perm is the mode of every output file: readable by the operator's group,
// never by other users (the files name the job's files and hosts).
const Perm os.FileMode = 0o640

// ErrUnsafe marks a path that is not written because of what it already is.
var ErrUnsafe = errors.New("unsafe output path")

// Check reports whether path may be created or replaced as an output: it
// must not exist, or be a regular file of this user with one link, or be
// an output written as it is (Special: /dev/null, /dev/stdout,
// /dev/stderr, a FIFO of this user). Lstat never follows the final
// component, so a symbolic link is reported as one.
func Check(path string) error {
	if stdStream(path) >= 0 {
		return nil
	}
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return checkMode(path, st)
}

func checkMode(path string, st os.FileInfo) error {
	switch {
	case st.Mode()&os.ModeSymlink != 0:
		target, _ := os.Readlink(path)
		return fmt.Errorf("%w: %s is a symbolic link (to %s); refusing to write through it, remove it or name another file",
			ErrUnsafe, path, target)
	case isDevNull(st):
		return nil
	case st.Mode()&os.ModeNamedPipe != 0:
		return owner(path, st)
	case !st.Mode().IsRegular():
		return fmt.Errorf("%w: %s exists and is not a regular file (%s)", ErrUnsafe, path, st.Mode().Type())
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok && s.Nlink > 1 {
		return fmt.Errorf("%w: %s has %d hard links; refusing to truncate a file shared with another path", ErrUnsafe, path, s.Nlink)
	}
	return owner(path, st)
}

// Create creates or truncates path for writing. It does not follow a
// symbolic link, does not block on a FIFO, and checks what it opened
// (not what a racing Lstat saw) before truncating.
func Create(path string) (*os.File, error) {
	// Checked first for a clear message; the checks on the opened file
	// below are what holds against a path swapped in between.
	if err := Check(path); err != nil {
		return nil, err
	}
	if f, ok, err := createSpecial(path); ok {
		return f, err
	}
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(Perm))
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return nil, fmt.Errorf("%w: %s is a symbolic link; refusing to write through it, remove it or name another file", ErrUnsafe, path)
		}
		return nil, &os.PathError{Op: "create", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	st, err := f.Stat()
	if err == nil {
		err = checkOpened(path, st)
	}
	if err == nil {
		// Regular file: blocking mode back, then truncate what we hold.
		err = unix.SetNonblock(fd, false)
	}
	if err == nil {
		err = f.Truncate(0)
	}
	if err == nil && st.Mode().Perm()&^Perm != 0 {
		// An existing file keeps its mode on open; outputs must not be
		// readable by every user.
		err = f.Chmod(st.Mode().Perm() & Perm)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// checkOpened is checkMode for an open file, which cannot be a link.
func checkOpened(path string, st os.FileInfo) error {
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%w: %s exists and is not a regular file (%s)", ErrUnsafe, path, st.Mode().Type())
	}
	if s, ok := st.Sys().(*syscall.Stat_t); ok && s.Nlink > 1 {
		return fmt.Errorf("%w: %s has %d hard links; refusing to truncate a file shared with another path", ErrUnsafe, path, s.Nlink)
	}
	return owner(path, st)
}

// WriteAtomic writes data to path through a new temporary file in the same
// directory (created exclusively, so never through a planted link), synced
// and renamed over path. On any error the temporary file is removed and
// path is left as it was: no partial file is ever under its name.
func WriteAtomic(path string, data []byte) error {
	f, err := CreateAtomic(path)
	if err != nil {
		return err
	}
	f.Write(data) //nolint:errcheck // kept in f and returned by Close
	return f.Close()
}

// isSymlinkErr: a symbolic link at path is replaced by an atomic file's
// rename, not written through, so it is no reason to refuse.
func isSymlinkErr(path string) bool {
	st, err := os.Lstat(path)
	return err == nil && st.Mode()&os.ModeSymlink != 0
}

// Atomic is an output that appears whole or not at all (a summary, a
// trace that is valid JSON only once finished): it is written to a new
// temporary file in the same directory, created exclusively with a random
// name (so a planted link or a file at a guessable name means nothing),
// and only Close renames it over its path, after a sync. A write that
// fails is kept: later writes do nothing, OnError hears of it at once,
// and Close removes the temporary file and leaves path as it was.
type Atomic struct {
	f      *os.File
	path   string
	err    error
	done   bool
	direct bool // a Special output: written as it is, no temporary file

	// OnError, when set, is called once with the first write error, when
	// it happens (the caller says so then, not only at exit).
	OnError func(error)
}

// CreateAtomic starts an atomic write of path. A symbolic link at path is
// accepted (the rename replaces the link, never its target); anything
// else Check refuses is refused.
func CreateAtomic(path string) (*Atomic, error) {
	if err := Check(path); err != nil && !isSymlinkErr(path) {
		return nil, err
	}
	if Special(path) {
		f, err := Create(path)
		if err != nil {
			return nil, err
		}
		return &Atomic{f: f, path: path, direct: true}, nil
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	removeStale(dir, base)
	// The pid in the name tells a later run whether its writer is gone.
	f, err := os.CreateTemp(dir, fmt.Sprintf(".%s.%d.*.tmp", base, os.Getpid())) // O_EXCL, mode 0600
	if err != nil {
		return nil, &WriteError{Path: path, Err: err, NotWritten: true}
	}
	if err := f.Chmod(Perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, &WriteError{Path: path, Err: err, NotWritten: true}
	}
	return &Atomic{f: f, path: path}, nil
}

// Name is the path the file will have once closed.
func (a *Atomic) Name() string { return a.path }

// Err is the first write error, nil while every write succeeded.
func (a *Atomic) Err() error { return a.err }

// Write writes to the temporary file; after a failure it writes nothing
// and returns the first error.
func (a *Atomic) Write(p []byte) (int, error) {
	if a.err != nil {
		return 0, a.err
	}
	n, err := a.f.Write(p)
	if err != nil {
		a.fail(err)
		return n, a.err
	}
	return n, nil
}

func (a *Atomic) fail(err error) {
	if a.err != nil {
		return
	}
	a.err = &WriteError{Path: a.path, Err: err, NotWritten: true}
	if a.OnError != nil {
		a.OnError(a.err)
	}
}

// Close syncs the temporary file and renames it over path. After a write
// error, or when the sync or rename fails, the temporary file is removed,
// path is left as it was and the error is returned (a *WriteError).
func (a *Atomic) Close() error {
	if a.done {
		return a.err
	}
	a.done = true
	if a.direct {
		if err := a.f.Close(); err != nil {
			a.fail(err)
		}
		return a.err
	}
	if a.err == nil {
		if err := a.f.Sync(); err != nil {
			a.fail(err)
		}
	}
	if err := a.f.Close(); err != nil {
		a.fail(err)
	}
	if a.err == nil {
		// rename replaces a symbolic link at path itself, never its target.
		if err := os.Rename(a.f.Name(), a.path); err != nil {
			a.fail(err)
		}
	}
	if a.err != nil {
		os.Remove(a.f.Name())
	}
	return a.err
}

// Abort removes the temporary file without touching path.
func (a *Atomic) Abort() {
	if a.done {
		return
	}
	a.done = true
	a.f.Close()
	if !a.direct {
		os.Remove(a.f.Name())
	}
}

// Stream is an output written in place as one stream whose reader copes
// with a cut-short end (a gzip recording). The first write error is kept:
// later writes do nothing, OnError hears of it when it happens, and Close
// returns it as a *WriteError.
type Stream struct {
	f    *os.File
	path string
	err  error

	// OnError, when set, is called once with the first write error.
	OnError func(error)
}

// CreateStream creates path with Create.
func CreateStream(path string) (*Stream, error) {
	f, err := Create(path)
	if err != nil {
		return nil, err
	}
	return &Stream{f: f, path: path}, nil
}

// Write writes p; after a failure it writes nothing and returns the first
// error.
func (s *Stream) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.f.Write(p)
	if err != nil {
		s.fail(err)
		return n, s.err
	}
	return n, nil
}

func (s *Stream) fail(err error) {
	if s.err != nil {
		return
	}
	s.err = &WriteError{Path: s.path, Err: err}
	if s.OnError != nil {
		s.OnError(s.err)
	}
}

// Close closes the file and returns the first write error, if any.
func (s *Stream) Close() error {
	if err := s.f.Close(); err != nil {
		s.fail(err)
	}
	return s.err
}

// Writer is an output file written in whole records (JSON lines). After a
// failed write (a full disk) it cuts the file back to the end of the last
// whole record, so a reader never finds half a line, and keeps failing:
// what is in the file is whole, and the error says what was lost.
type Writer struct {
	f       *os.File
	path    string
	good    int64 // size after the last whole record
	err     error
	special bool // a Special output: never rotated nor cut back

	// MaxSize, when positive, caps the file: a write that would take it
	// past MaxSize first rotates it to path.1 (path.1 to path.2, … up to
	// Keep files; the oldest is removed) and starts an empty file, so the
	// disk holds at most (Keep+1)·MaxSize plus one record.
	MaxSize int64
	Keep    int
	// Rotated counts rotations; RotateErr is why one failed: the file is
	// then written on past MaxSize, its records kept, and not rotated again.
	Rotated   int
	RotateErr error
}

// NewWriter creates path with Create.
func NewWriter(path string) (*Writer, error) {
	f, err := Create(path)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &Writer{f: f, path: path, special: !st.Mode().IsRegular()}, nil
}

// Name is the file's path.
func (w *Writer) Name() string { return w.f.Name() }

// Size is the number of bytes of whole records written.
func (w *Writer) Size() int64 { return w.good }

// Err is the first write error, nil while every record was written.
func (w *Writer) Err() error { return w.err }

// WriteRecords appends p, which must end at a record boundary. On error
// the file is truncated back to the previous boundary.
func (w *Writer) WriteRecords(p []byte) error {
	if w.err != nil {
		return w.err
	}
	if w.MaxSize > 0 && !w.special && w.good > 0 && w.good+int64(len(p)) > w.MaxSize && w.RotateErr == nil {
		// A rotation that fails keeps the records in the file as it is,
		// past its cap: never lost.
		w.RotateErr = w.rotate()
		if w.err != nil {
			return w.err
		}
	}
	n, err := w.f.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil && w.special {
		w.err = &WriteError{Path: w.f.Name(), Err: err}
		return w.err
	}
	if err != nil {
		if terr := w.f.Truncate(w.good); terr != nil {
			err = errors.Join(err, fmt.Errorf("cut back to the last whole record: %w", terr))
		} else {
			w.f.Seek(w.good, io.SeekStart) //nolint:errcheck // the writer fails from now on anyway
		}
		w.err = &WriteError{Path: w.f.Name(), Err: err}
		return w.err
	}
	w.good += int64(n)
	return nil
}

// WriteError is an output that could not be written whole: a full disk,
// a quota, an I/O error. The file holds the records written before it.
type WriteError struct {
	Path string
	Err  error
	// NotWritten: an atomic output, so nothing of this run is at Path
	// (an earlier file there is left as it was).
	NotWritten bool
}

func (e *WriteError) Error() string {
	err := e.Err
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err // the path is said once
	}
	if e.NotWritten {
		return fmt.Sprintf("write %s: %v (not written: nothing of this run is under that name)", e.Path, err)
	}
	return fmt.Sprintf("write %s: %v (the file holds only what was written before)", e.Path, err)
}

func (e *WriteError) Unwrap() error { return e.Err }

// FailedPaths lists the outputs err says could not be written whole,
// however deeply it wraps or joins their WriteErrors.
func FailedPaths(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		switch x := e.(type) { //nolint:errorlint // walks the whole tree itself: errors.As stops at the first match
		case nil:
			return
		case *WriteError:
			out = append(out, x.Path)
			return
		case interface{ Unwrap() []error }:
			for _, c := range x.Unwrap() {
				walk(c)
			}
		case interface{ Unwrap() error }:
			walk(x.Unwrap())
		}
	}
	walk(err)
	return out
}

// Close closes the file; it returns the first write error, if any.
func (w *Writer) Close() error {
	err := w.f.Close()
	if w.err != nil {
		return w.err
	}
	if err != nil {
		return &WriteError{Path: w.f.Name(), Err: err}
	}
	return nil
}
