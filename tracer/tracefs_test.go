package tracer

import (
	"os"
	"strings"
	"testing"
)

// TestTracefsClosedToThisUser: a tracefs that is mounted but closed to
// this user (root's 0700 to a non-root user with the capabilities) is
// said as such, with check's words and fix, rather than as a failed mount.
func TestTracefsClosedToThisUser(t *testing.T) {
	err := ensureTracefs(func(p string) (os.FileInfo, error) {
		return nil, &os.PathError{Op: "stat", Path: p, Err: os.ErrPermission}
	})
	if err == nil || !strings.Contains(err.Error(), "/sys/kernel/tracing is mounted but not readable by this user") ||
		!strings.Contains(err.Error(), "run as root, or as UID 0 with the capabilities") || strings.Contains(err.Error(), "mounting it") {
		t.Errorf("ensureTracefs: %v", err)
	}
}
