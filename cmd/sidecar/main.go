// Command gaptrace traces a GPU training process and explains, continuously
// and at low cost, why its GPU sat idle: every idle gap is attributed to a
// cause (input I/O, data-loader waits, checkpoint writes, synchronous
// logging, collectives, copies, allocation, CPU, contention, sleep) with
// the evidence, and exported as OpenTelemetry spans, metrics and files.
//
// The command line, configuration and session lifecycle live in
// internal/cli; this package wires the tracing machinery (tracer, GPU
// sampler, correlation engine, exporter) into it: pipeline.go sets it up,
// pipeline_feed.go runs the event loop, pipeline_peers.go talks to the
// job's other sidecars and pipeline_close.go ends it.
package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"

	"golang.org/x/term"

	// Imported here, first among the module's packages, so that a cold
	// "go build" starts go-nvml's long cgo step (a tenth of the build's
	// critical path) at the beginning rather than last: go build orders
	// ready work by a depth-first walk of the imports.
	_ "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/cli"
	"github.com/gaptrace/gaptrace/cmd/sidecar/internal/proc"
	"github.com/gaptrace/gaptrace/internal/safefile"
)

// version is set at build time: -ldflags "-X main.version=...".
var version = "dev"

// memoryLimit caps the memory the Go runtime manages (heap, stacks) unless
// GOMEMLIMIT says otherwise: a sidecar shares its pod's memory with the job.
// The live heap is 14-25 MB (8 ranks; a PyTorch job with its libraries'
// symbols); without a limit the collector let it double, and reading a
// large library's symbols pushed RSS past 100 MB. At 64 MiB an H100
// PyTorch job with a DataLoader still peaked at 94-105 MiB, its heap
// reaching 50 MB between collections (GOGC 200); at 48, 35 MB and 91 MiB
// (the executable is ~20 MiB of it). Near the limit the collector runs
// more often instead.
const memoryLimit = 48 << 20

// maxProcs caps the threads that run Go code at once unless GOMAXPROCS
// says otherwise. The sidecar's work is one pipeline of a few goroutines
// that wake together on the wake-up grid (internal/wake), at most 50 times
// a second, and use a few percent of one core; a second thread only spins
// through the run queues looking for work each time a goroutine readies
// another. On a GPU host's 16+ cores that spinning was 12-25% of the
// sidecar's CPU (an H200 host, 16 threads -> 2); on a 2-core VM, one
// thread against two took 8 ranks 6.15% -> 5.25% of a core (medians of 14
// interleaved pairs, lower in 13) and a loader job 4.3% -> 3.4% (3 of 3);
// a launch-bound job moved within its noise. A thread blocked in a system
// call or NVML hands the processor on, as with any count.
const maxProcs = 1

// gcPercent is the collector's GOGC unless the environment sets it. At
// the default 100 the sidecar collected every ~25 MB it allocated, and
// marking was 15% of its CPU on a loader job (~190 steps a second, each
// building its spans); at 200, 5.4% -> 4.6% of a core (median of 3
// interleaved pairs, tools/sidecar-cost.sh loader auto 20) for 4-12 MiB
// more peak RSS, and memoryLimit still bounds the heap.
const gcPercent = 200

// runtimeLimits applies memoryLimit, gcPercent and maxProcs where the
// environment does not set GOMEMLIMIT, GOGC or GOMAXPROCS.
func runtimeLimits(getenv func(string) string) {
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(memoryLimit)
	}
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > maxProcs {
		runtime.GOMAXPROCS(maxProcs)
	}
}

func main() {
	runtimeLimits(os.Getenv)
	stop := func() {}
	if len(os.Args) < 2 || os.Args[1] != proc.ExecHelperArg { // the helper execs the command at once
		var err error
		if stop, err = profile(os.Getenv("GAPTRACE_PPROF")); err != nil {
			fmt.Fprintf(os.Stderr, "gaptrace: GAPTRACE_PPROF: %v\n", err)
			os.Exit(cli.ExitUsage)
		}
	}
	code := cli.Main(context.Background(), os.Args[1:], cli.Deps{
		Version:     version,
		NewPipeline: newPipeline,
		GPU:         inspectGPU,
		IsTerminal:  stdoutTerminal,
		TerminalRows: func() int {
			_, h, err := term.GetSize(int(os.Stdout.Fd()))
			if err != nil {
				return 0
			}
			return h
		},
	})
	stop()
	os.Exit(code)
}

// profile, when path is set (GAPTRACE_PPROF, not a documented option: it is
// for measuring gaptrace itself), writes a CPU profile of the whole run to
// path.cpu and a heap profile at exit to path.heap, for go tool pprof.
// Both files are created at once, as every output is (safefile: never
// through a link, mode 0640), so a path that cannot be written is refused
// before anything runs.
func profile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	for _, p := range []string{path + ".cpu", path + ".heap"} {
		if err := safefile.Check(p); err != nil {
			return nil, err
		}
	}
	cpu, err := safefile.Create(path + ".cpu")
	if err != nil {
		return nil, err
	}
	heap, err := safefile.Create(path + ".heap")
	if err == nil {
		err = pprof.StartCPUProfile(cpu)
	}
	if err != nil {
		cpu.Close()
		if heap != nil {
			heap.Close()
		}
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		cpu.Close()
		_ = pprof.WriteHeapProfile(heap) // best effort: a measuring aid
		heap.Close()
	}, nil
}

func stdoutTerminal() (bool, int) {
	fd := int(os.Stdout.Fd())
	if !term.IsTerminal(fd) {
		return false, 100
	}
	w, _, err := term.GetSize(fd)
	if err != nil || w <= 0 {
		w = 100
	}
	return true, w
}
