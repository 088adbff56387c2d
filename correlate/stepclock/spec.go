package stepclock

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/gaptrace/gaptrace/event"
)

// A declared step site (--step-at): parsed from FILE:LINE or a function
// name, matched against a call's stack.

// Spec is a declared step site: FILE:LINE or a function name.
type Spec struct {
	File string // "" for a function
	Line int
	Func string
}

// ParseSpec reads a declared step site: FILE:LINE (train.py:142, a path
// suffix of the frame's file) or a function name (train_step,
// Trainer.train_step, a native symbol).
func ParseSpec(v string) (Spec, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return Spec{}, errors.New("empty: give FILE:LINE (train.py:142) or a function name (train_step)")
	}
	if strings.IndexFunc(v, unicode.IsSpace) >= 0 {
		return Spec{}, fmt.Errorf("%q holds a space: give FILE:LINE (train.py:142) or a function name (train_step)", v)
	}
	if i := strings.LastIndexByte(v, ':'); i >= 0 && i+1 < len(v) && allDigits(v[i+1:]) {
		line, err := strconv.Atoi(v[i+1:])
		if err != nil || line <= 0 {
			return Spec{}, fmt.Errorf("%q: line must be a positive number", v)
		}
		if i == 0 {
			return Spec{}, fmt.Errorf("%q: no file before the line", v)
		}
		return Spec{File: v[:i], Line: line}, nil
	}
	if strings.HasSuffix(v, ":") {
		return Spec{}, fmt.Errorf("%q: no line after the colon (train.py:142)", v)
	}
	if strings.ContainsAny(v, "/\\") || strings.HasSuffix(v, ".py") {
		return Spec{}, fmt.Errorf("%q names a file without a line: give FILE:LINE (train.py:142)", v)
	}
	return Spec{Func: v}, nil
}

func allDigits(s string) bool {
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return s != ""
}

func (s Spec) String() string {
	if s.File != "" {
		return s.File + ":" + strconv.Itoa(s.Line)
	}
	return s.Func
}

// Match is the frame of stack that the spec names, ok false when none.
func (s Spec) Match(stack []event.Frame) (event.Frame, bool) {
	for _, f := range stack {
		if s.File != "" {
			if f.Line == s.Line && pathSuffix(f.Where(), s.File) {
				return f, true
			}
			continue
		}
		if f.Function == s.Func || strings.HasSuffix(f.Function, "."+s.Func) || strings.HasSuffix(f.Function, "::"+s.Func) {
			return f, true
		}
	}
	return event.Frame{}, false
}

// pathSuffix says whether file is suffix, or ends with "/"+suffix.
func pathSuffix(file, suffix string) bool {
	return file == suffix || strings.HasSuffix(file, "/"+strings.TrimPrefix(suffix, "./"))
}

// MatchName is how a summary names the frame a declared spec matched.
func MatchName(f event.Frame) string { return frameName(f) }
