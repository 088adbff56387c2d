package safefile

import (
	"errors"
	"fmt"
	"os"
)

// maxObstacles bounds the numbers rotation passes over.
const maxObstacles = 16

// rotate shifts the rotated files up one number (the last one is
// removed), path to the first, and opens a new path. Renames move links,
// never write through them, and the new file is made by Create. A number
// taken by something rotation does not replace (a directory, a device) is
// passed over: the files take the next free numbers. Should the current
// file not move, it stays open and is written on: no record is lost.
func (w *Writer) rotate() error {
	keep := max(w.Keep, 0)
	if keep == 0 {
		if err := os.Remove(w.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	} else {
		slots := w.slots(keep)
		if len(slots) == 0 {
			return fmt.Errorf("%s.1 to %s.%d are all taken by something other than a rotated file", w.path, w.path, keep+maxObstacles)
		}
		last := slots[len(slots)-1]
		if len(slots) == keep {
			if err := os.Remove(last); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		for i := len(slots) - 2; i >= 0; i-- {
			if err := os.Rename(slots[i], slots[i+1]); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
		if err := os.Rename(w.path, slots[0]); err != nil {
			return err
		}
	}
	old := w.f
	f, err := Create(w.path)
	if err != nil {
		// The records are in the rotated file; nothing more is written.
		old.Close()
		w.err = &WriteError{Path: w.path, Err: fmt.Errorf("rotate: %w", err)}
		return err
	}
	old.Close()
	w.f, w.good = f, 0
	w.Rotated++
	return nil
}

// slots is the names rotated files take, up to keep of them, in order:
// path.1, path.2, … less those taken by anything but a regular file or a
// link (which a rename replaces, never writes through).
func (w *Writer) slots(keep int) []string {
	var out []string
	for i := 1; i <= keep+maxObstacles && len(out) < keep; i++ {
		name := fmt.Sprintf("%s.%d", w.path, i)
		st, err := os.Lstat(name)
		if err == nil && !st.Mode().IsRegular() && st.Mode()&os.ModeSymlink == 0 {
			continue
		}
		out = append(out, name)
	}
	return out
}
