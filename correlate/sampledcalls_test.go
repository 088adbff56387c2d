package correlate

import (
	"testing"

	"github.com/gaptrace/gaptrace/event"
)

func TestWrapperClass(t *testing.T) {
	libc := "/usr/lib/x86_64-linux-gnu/libc.so.6"
	for _, c := range []struct {
		f    event.Frame
		want event.SyscallClass
	}{
		{event.Frame{Function: "__write", File: libc}, event.SysWrite},
		{event.Frame{Function: "pwrite64", File: libc}, event.SysWrite},
		{event.Frame{Function: "preadv2", File: libc}, event.SysRead},
		{event.Frame{Function: "__GI___libc_read", File: "/lib/x86_64-linux-gnu/libc-2.31.so"}, event.SysRead},
		{event.Frame{Function: "fsync", File: libc}, event.SysOther},
		{event.Frame{Function: "write", File: "/job/mylib.so"}, event.SysOther}, // the job's own write()
		{event.Frame{Function: "write", File: "/job/train.py", Line: 3}, event.SysOther},
	} {
		if got := wrapperClass(c.f); got != c.want {
			t.Errorf("%+v: %v, want %v", c.f, got, c.want)
		}
	}
}
