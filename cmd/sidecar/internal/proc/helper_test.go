package proc

import (
	"os"
	"runtime"
	"testing"
	"time"
)

// spinEnv makes the test binary, run as the exec helper, keep other
// goroutines busy while it waits to be released, so that the goroutine
// reading the release pipe is likely to resume on another thread unless it
// is locked to the main one.
const spinEnv = "GAPTRACE_TEST_HELPER_SPIN"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ExecHelperArg {
		if os.Getenv(spinEnv) != "" {
			for range 2 * runtime.GOMAXPROCS(0) {
				go func() {
					for {
						runtime.Gosched()
					}
				}()
			}
		}
		os.Exit(ExecHelper(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// TestExecHelperExecsFromMainThread: the held command must be exec'd by the
// helper's main thread, or probes attached by PID before the release stay
// bound to the retired leader and see nothing (the demo that reported 0
// steps). The helper refuses (exit 125) rather than exec from another
// thread; with busy goroutines beside it, the released goroutine resumed
// elsewhere within three runs before it was locked to the main thread.
func TestExecHelperExecsFromMainThread(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), spinEnv+"=1")
	for i := range 8 {
		c, err := StartHeld(self, []string{"true"}, env)
		if err != nil {
			t.Fatal(err)
		}
		// Released only once the helper waits on the pipe and its
		// spinners run: the wait a slow probe attach makes.
		time.Sleep(30 * time.Millisecond)
		if err := c.Release(); err != nil {
			t.Fatal(err)
		}
		code, err := c.Wait()
		if err != nil || code != 0 {
			t.Fatalf("run %d: exit %d (%v): the helper did not exec from its main thread", i, code, err)
		}
	}
}
