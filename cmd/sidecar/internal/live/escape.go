package live

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Escape makes a string from the traced program (a file name, a process
// name, a command line, a library path) safe to print on the operator's
// terminal: control characters (C0 including newline and ESC, DEL, C1),
// bidirectional overrides and bytes that are not UTF-8 are written as Go
// escapes, so no title, clipboard (OSC 52) or screen-clearing sequence
// reaches the terminal and no newline starts a forged log line. Printable
// text, non-ASCII letters included, passes unchanged.
func Escape(s string) string {
	if !needsEscape(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case escapedRune(r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func needsEscape(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || escapedRune(r) {
			return true
		}
	}
	return false
}

func escapedRune(r rune) bool {
	switch {
	case r < 0x20, r == 0x7f, r >= 0x80 && r < 0xa0:
		return true
	case r == 0x200e, r == 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true // bidi controls reorder what the operator reads
	}
	return false
}

// logValue is Escape for the key=value log line: a value with a space,
// a quote or an equals sign is quoted so it cannot pose as more fields.
func logValue(s string) string {
	s = Escape(s)
	if s == "" || strings.ContainsAny(s, " \"=") {
		return strconv.Quote(s)
	}
	return s
}
