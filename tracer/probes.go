package tracer

import (
	"debug/elf"
	"errors"
	"fmt"

	"github.com/cilium/ebpf"

	"github.com/gaptrace/gaptrace/event"
)

// Which library a uprobe belongs to.
type library uint8

const (
	libCUDA library = iota
	libNCCL
	libMarker // a library defining the framework marker function (marker.go)
)

func (l library) String() string {
	if l == libMarker {
		return "record_function"
	}
	if l == libNCCL {
		return "libnccl.so.2"
	}
	return "libcuda.so.1"
}

// Cookie layouts (the second byte of the attach cookie): the enums of
// bpf/cuda.c as bpf2go generated them.
const (
	llStreamArg9 = uint8(cudaLaunchLayoutLL_STREAM_ARG9)
	llConfig     = uint8(cudaLaunchLayoutLL_CONFIG)
	llStreamArg2 = uint8(cudaLaunchLayoutLL_STREAM_ARG2)

	alBytes3Stream4 = uint8(cudaAsyncLayoutAL_BYTES3STREAM4)
	alPeer          = uint8(cudaAsyncLayoutAL_PEER)
	al2D            = uint8(cudaAsyncLayoutAL_2D)
	al3D            = uint8(cudaAsyncLayoutAL_3D)
	alMemset2D      = uint8(cudaAsyncLayoutAL_MEMSET2D)

	blNone          = uint8(cudaBlockLayoutBL_NONE)
	blStream1       = uint8(cudaBlockLayoutBL_STREAM1)
	blBytes3        = uint8(cudaBlockLayoutBL_BYTES3)
	blBytes2        = uint8(cudaBlockLayoutBL_BYTES2)
	blBytes2Stream3 = uint8(cudaBlockLayoutBL_BYTES2STREAM3)
	blStream2       = uint8(cudaBlockLayoutBL_STREAM2)
)

func cookie(fn uint8, layout uint8, elt uint8) uint64 {
	return uint64(fn) | uint64(layout)<<8 | uint64(elt)<<16
}

// probeSpec is one function to probe. symbols are the names it may be
// exported under (versioned and per-thread-default-stream variants are
// distinct functions and all get probed; aliases at one address get one
// probe); it is reported missing only when none exists.
type probeSpec struct {
	lib     library
	name    string   // reported name
	symbols []string // exported names, canonical first
	entry   program  // program for the entry probe (nil if none)
	ret     program  // program for the return probe (nil if none)
	cookie  uint64
	launch  bool // a per-launch probe: left out of ProbesLite
}

// program picks one loaded program out of the tracer: the table below is
// written before any object is loaded, so it names each program by the
// field bpf2go generated for it rather than by the program itself.
type program func(*Tracer) *ebpf.Program

func progCudaLaunch(t *Tracer) *ebpf.Program        { return t.cuda.CudaLaunch }
func progCudaAsync(t *Tracer) *ebpf.Program         { return t.cuda.CudaAsync }
func progCudaAsyncExit(t *Tracer) *ebpf.Program     { return t.cuda.CudaAsyncExit }
func progCudaBlockEnter(t *Tracer) *ebpf.Program    { return t.cuda.CudaBlockEnter }
func progCudaBlockExit(t *Tracer) *ebpf.Program     { return t.cuda.CudaBlockExit }
func progNcclColl(t *Tracer) *ebpf.Program          { return t.nccl.NcclColl }
func progNcclGroupStart(t *Tracer) *ebpf.Program    { return t.nccl.NcclGroupStart }
func progNcclGroupEndEnter(t *Tracer) *ebpf.Program { return t.nccl.NcclGroupEndEnter }
func progNcclGroupEndExit(t *Tracer) *ebpf.Program  { return t.nccl.NcclGroupEndExit }
func progNcclCommInitEnter(t *Tracer) *ebpf.Program { return t.nccl.NcclCommInitEnter }
func progNcclCommInitExit(t *Tracer) *ebpf.Program  { return t.nccl.NcclCommInitExit }

func commInitSpec(name string) probeSpec {
	return probeSpec{lib: libNCCL, name: name, symbols: []string{name, "p" + name}, entry: progNcclCommInitEnter, ret: progNcclCommInitExit}
}

func cudaSpec(name string, symbols []string, entry, ret program, ck uint64, launch bool) probeSpec {
	return probeSpec{lib: libCUDA, name: name, symbols: symbols, entry: entry, ret: ret, cookie: ck, launch: launch}
}

func launchSpec(name string, fn event.CUDA, layout uint8) probeSpec {
	return cudaSpec(name, []string{name, name + "_ptsz"}, progCudaLaunch, nil, cookie(uint8(fn), layout, 0), true)
}

func asyncSpec(name string, fn event.CUDA, layout, elt uint8) probeSpec {
	return cudaSpec(name, []string{name, name + "_ptsz"}, progCudaAsync, nil, cookie(uint8(fn), layout, elt), false)
}

// hostCopySpec is an async copy that may read or write host memory: from
// pageable memory it keeps the host in the call while the driver stages
// it, so it also gets a return probe, which emits KindMemcpyStaged when
// the call lasted. dir (the cookie's fourth byte) is the direction that
// event reports. Copies are a few per step, so lite gets it too: one more
// trap per copy.
func hostCopySpec(name string, layout uint8, dir event.CUDA) probeSpec {
	s := asyncSpec(name, event.CUMemcpyAsync, layout, 1)
	s.ret = progCudaAsyncExit
	s.cookie |= uint64(dir) << 24
	return s
}

func blockSpec(name string, alts []string, fn event.CUDA, layout uint8) probeSpec {
	return cudaSpec(name, append([]string{name}, alts...), progCudaBlockEnter, progCudaBlockExit, cookie(uint8(fn), layout, 0), false)
}

func ncclSpec(name string, op event.NCCLOp) probeSpec {
	return probeSpec{lib: libNCCL, name: name, symbols: []string{name, "p" + name}, entry: progNcclColl, cookie: uint64(op)}
}

// allProbes is the probe table of DESIGN.md. Order matters only for
// aliases: the first name seen at an address is the one attached.
var allProbes = []probeSpec{
	launchSpec("cuLaunchKernel", event.CULaunchKernel, llStreamArg9),
	launchSpec("cuLaunchKernelEx", event.CULaunchKernelEx, llConfig),
	launchSpec("cuLaunchCooperativeKernel", event.CULaunchCooperativeKernel, llStreamArg9),
	launchSpec("cuGraphLaunch", event.CUGraphLaunch, llStreamArg2),

	hostCopySpec("cuMemcpyAsync", alBytes3Stream4, event.CUMemcpyOther),
	hostCopySpec("cuMemcpyHtoDAsync_v2", alBytes3Stream4, event.CUMemcpyHtoD),
	hostCopySpec("cuMemcpyDtoHAsync_v2", alBytes3Stream4, event.CUMemcpyDtoH),
	asyncSpec("cuMemcpyDtoDAsync_v2", event.CUMemcpyAsync, alBytes3Stream4, 1),
	asyncSpec("cuMemcpyPeerAsync", event.CUMemcpyAsync, alPeer, 1),
	hostCopySpec("cuMemcpy2DAsync_v2", al2D, event.CUMemcpyOther),
	hostCopySpec("cuMemcpy3DAsync_v2", al3D, event.CUMemcpyOther),
	asyncSpec("cuMemsetD8Async", event.CUMemsetAsync, alBytes3Stream4, 1),
	asyncSpec("cuMemsetD16Async", event.CUMemsetAsync, alBytes3Stream4, 2),
	asyncSpec("cuMemsetD32Async", event.CUMemsetAsync, alBytes3Stream4, 4),
	asyncSpec("cuMemsetD2D8Async", event.CUMemsetAsync, alMemset2D, 1),
	asyncSpec("cuMemsetD2D16Async", event.CUMemsetAsync, alMemset2D, 2),
	asyncSpec("cuMemsetD2D32Async", event.CUMemsetAsync, alMemset2D, 4),

	blockSpec("cuMemcpyHtoD_v2", []string{"cuMemcpyHtoD_v2_ptds"}, event.CUMemcpyHtoD, blBytes3),
	blockSpec("cuMemcpyDtoH_v2", []string{"cuMemcpyDtoH_v2_ptds"}, event.CUMemcpyDtoH, blBytes3),
	blockSpec("cuMemcpyDtoD_v2", []string{"cuMemcpyDtoD_v2_ptds"}, event.CUMemcpyOther, blBytes3),
	blockSpec("cuMemcpy", []string{"cuMemcpy_ptds"}, event.CUMemcpyOther, blBytes3),
	blockSpec("cuStreamSynchronize", []string{"cuStreamSynchronize_ptsz"}, event.CUStreamSynchronize, blStream1),
	// CUDA 13's runtime implements cudaDeviceSynchronize (torch.cuda.synchronize)
	// with cuCtxSynchronize_v2, which takes the context; the event is the same.
	blockSpec("cuCtxSynchronize", []string{"cuCtxSynchronize_v2"}, event.CUCtxSynchronize, blNone),
	blockSpec("cuEventSynchronize", nil, event.CUEventSynchronize, blNone),
	blockSpec("cuMemAlloc_v2", nil, event.CUMemAlloc, blBytes2),
	blockSpec("cuMemAllocAsync", []string{"cuMemAllocAsync_ptsz"}, event.CUMemAlloc, blBytes2Stream3),
	blockSpec("cuMemFree_v2", nil, event.CUMemFree, blNone),
	blockSpec("cuMemFreeAsync", []string{"cuMemFreeAsync_ptsz"}, event.CUMemFree, blStream2),

	ncclSpec("ncclAllReduce", event.NCCLAllReduce),
	ncclSpec("ncclAllGather", event.NCCLAllGather),
	ncclSpec("ncclReduceScatter", event.NCCLReduceScatter),
	ncclSpec("ncclBroadcast", event.NCCLBroadcast),
	ncclSpec("ncclReduce", event.NCCLReduce),
	ncclSpec("ncclSend", event.NCCLSend),
	ncclSpec("ncclRecv", event.NCCLRecv),
	commInitSpec("ncclCommInitRank"),
	commInitSpec("ncclCommInitRankConfig"),
	commInitSpec("ncclCommInitRankScalable"),
	{lib: libNCCL, name: "ncclGroupStart", symbols: []string{"ncclGroupStart", "pncclGroupStart"}, entry: progNcclGroupStart},
	{lib: libNCCL, name: "ncclGroupEnd", symbols: []string{"ncclGroupEnd", "pncclGroupEnd"}, entry: progNcclGroupEndEnter, ret: progNcclGroupEndExit},
}

// plannedProbe is one uprobe (and maybe uretprobe) to attach at one address.
type plannedProbe struct {
	spec   *probeSpec
	symbol string
	addr   uint64
	// off: where the probe goes in the file, when the plan resolved it
	// itself (the marker); 0: the attach resolves symbol.
	off uint64
}

// probesLaunch is planProbes's selection of the per-launch probes alone:
// what ProbesAuto attaches and detaches around its full windows.
const probesLaunch ProbeSet = "launch"

// planProbes resolves the probe table against one library file. It returns
// one probe per distinct function address (so weak aliases such as
// ncclAllReduce/pncclAllReduce are probed once) and the names of functions
// that the library does not export at all.
func planProbes(path string, lib library, set ProbeSet) (planned []plannedProbe, missing []string, err error) {
	if lib == libMarker {
		if set == probesLaunch {
			return nil, nil, nil
		}
		return planMarker(path)
	}
	syms, err := elfFunctions(path)
	if err != nil {
		return nil, nil, err
	}
	seen := make(map[uint64]bool)
	for i := range allProbes {
		spec := &allProbes[i]
		if spec.lib != lib || ((set == ProbesLite || set == ProbesAuto) && spec.launch) || (set == probesLaunch && !spec.launch) {
			continue
		}
		found := false
		for _, s := range spec.symbols {
			addr, ok := syms[s]
			if !ok {
				continue
			}
			found = true
			if seen[addr] {
				continue
			}
			seen[addr] = true
			planned = append(planned, plannedProbe{spec: spec, symbol: s, addr: addr})
		}
		if !found {
			missing = append(missing, spec.name)
		}
	}
	return planned, missing, nil
}

// elfFunctions returns the defined function symbols of a shared library
// (dynamic symbols first: that is what a stripped driver still has), by
// name, with versioned names ("cuGetProcAddress@@libcuda.so.1") reduced to
// the bare name.
func elfFunctions(path string) (map[string]uint64, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open elf %s: %w", path, err)
	}
	defer f.Close()
	out := make(map[string]uint64)
	add := func(syms []elf.Symbol) {
		for _, s := range syms {
			if elf.ST_TYPE(s.Info) != elf.STT_FUNC && elf.ST_TYPE(s.Info) != elf.STT_GNU_IFUNC {
				continue
			}
			if s.Section == elf.SHN_UNDEF || s.Value == 0 {
				continue
			}
			if _, ok := out[s.Name]; !ok {
				out[s.Name] = s.Value
			}
		}
	}
	dyn, derr := f.DynamicSymbols()
	add(dyn)
	st, serr := f.Symbols()
	add(st)
	if len(out) == 0 {
		return nil, fmt.Errorf("read symbols of %s: %w", path, errors.Join(derr, serr))
	}
	return out, nil
}
