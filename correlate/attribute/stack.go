package attribute

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gaptrace/gaptrace/event"
)

// UserFrame is the index of the innermost frame of the job's own code: not
// the C library, the CUDA libraries, the Python interpreter, its standard
// library or installed packages. -1 when every frame is theirs.
func UserFrame(stack []event.Frame) int {
	for i, f := range stack {
		if !event.SystemCode(f.File) {
			return i
		}
	}
	return -1
}

// SiteFrame is the frame a gap is charged to: the innermost user frame,
// else the innermost frame; ok is false for an empty stack.
func SiteFrame(stack []event.Frame) (event.Frame, bool) {
	if len(stack) == 0 {
		return event.Frame{}, false
	}
	if i := UserFrame(stack); i >= 0 {
		return stack[i], true
	}
	return stack[0], true
}

// CallSite names a frame the way a person finds it: "train.py:142
// save_checkpoint" with a line, "simtrain read_cold_until" without.
func CallSite(f event.Frame) string {
	base := filepath.Base(f.Where())
	switch {
	case f.File == "":
		return f.Function
	case f.Line > 0:
		return fmt.Sprintf("%s:%d %s", base, f.Line, f.Function)
	}
	return base + " " + f.Function
}

// FormatStack renders a stack one frame a line, innermost first:
// "save_checkpoint (train.py:142)".
func FormatStack(stack []event.Frame, truncated bool) string {
	var b strings.Builder
	for i, f := range stack {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(f.Function)
		switch {
		case f.File != "" && f.Line > 0:
			fmt.Fprintf(&b, " (%s:%d)", f.Where(), f.Line)
		case f.File != "":
			fmt.Fprintf(&b, " (%s)", f.File)
		}
	}
	if truncated {
		b.WriteString("\n… (truncated)")
	}
	return b.String()
}
