package live

import (
	"fmt"
	"io"
	"strings"
	"sync"
)

// Terminal keeps the frame in the bottom rows of the terminal and leaves
// the rows above to everyone else: it sets the terminal's scroll region
// (DECSTBM) to the rows above the frame, so the traced command, which writes
// to the same terminal directly, scrolls there and never across the frame.
// gaptrace interposes nothing between the command and the terminal: if
// gaptrace dies (kill -9), the command's output keeps flowing; only the last
// frame stays on screen until `reset` (or `tput csr`).
//
// Each update is one write, saving and restoring the cursor around it, so it
// cannot interleave with the command's writes (the tty serializes write
// calls) and leaves the command's cursor where it was. Safe for concurrent
// use.
type Terminal struct {
	W io.Writer
	// Rows reports the terminal's height; nil or 0 (unknown) draws nothing.
	Rows func() int

	mu       sync.Mutex
	reserved int // rows held for the frame at the bottom (0: none)
	height   int // terminal height the scroll region was set for
	stopped  bool
}

// minOutputRows are kept for the command's output however tall the frame.
const minOutputRows = 4

// SizeKnown says whether the terminal reports a height the frame can be
// drawn in. A pseudo-terminal nobody sized (script(1) run without a
// terminal, some CI runners and serial consoles) reports 0 rows: Draw
// would draw nothing there.
func (t *Terminal) SizeKnown() bool {
	return t.Rows != nil && t.Rows() >= minOutputRows+1
}

const (
	saveCursor    = "\x1b7"
	restoreCursor = "\x1b8"
)

// Draw replaces the previous frame with frame. The area grows with the
// frame and never shrinks while tracing, so the command's text above does
// not jump up and down; a frame taller than the terminal allows is cut.
func (t *Terminal) Draw(frame string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped || t.Rows == nil {
		return
	}
	h := t.Rows()
	if h < minOutputRows+1 {
		return
	}
	lines := strings.Split(strings.TrimSuffix(frame, "\n"), "\n")
	need := max(len(lines), t.reserved)
	need = min(need, h-minOutputRows)
	var b strings.Builder
	switch {
	case t.reserved == 0:
		// Make room below the cursor (scrolling what is on screen up if
		// needed), go back to the line the command writes next, and
		// fence the rows below it off.
		b.WriteString(strings.Repeat("\n", need))
		fmt.Fprintf(&b, "\x1b[%dA", need)
		fmt.Fprintf(&b, "%s\x1b[1;%dr%s", saveCursor, h-need, restoreCursor)
	case need > t.reserved || h != t.height:
		if grow := need - t.reserved; grow > 0 && h == t.height {
			// Scroll the command's region up by grow rows, then follow
			// its cursor up before the region shrinks.
			fmt.Fprintf(&b, "%s\x1b[%d;1H%s%s\x1b[%dA", saveCursor, h-t.reserved, strings.Repeat("\n", grow), restoreCursor, grow)
		}
		fmt.Fprintf(&b, "%s\x1b[1;%dr%s", saveCursor, h-need, restoreCursor)
	}
	t.reserved, t.height = need, h
	b.WriteString(saveCursor)
	for i := range need {
		fmt.Fprintf(&b, "\x1b[%d;1H\x1b[2K", h-need+1+i)
		if i < len(lines) {
			b.WriteString(lines[i])
		}
	}
	b.WriteString(restoreCursor)
	io.WriteString(t.W, b.String()) //nolint:errcheck // a closed terminal is not worth failing the trace for
}

// Clear erases the frame for good and gives the whole terminal back:
// later output (the summary) goes where the command's cursor is.
func (t *Terminal) Clear() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return
	}
	t.stopped = true
	if t.reserved == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s\x1b[r\x1b[%d;1H\x1b[J%s", saveCursor, t.height-t.reserved+1, restoreCursor)
	t.reserved = 0
	io.WriteString(t.W, b.String()) //nolint:errcheck // see Draw
}
