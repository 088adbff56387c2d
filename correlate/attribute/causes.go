package attribute

import "github.com/gaptrace/gaptrace/event"

// BaseCause maps one blocking interval to a cause, before following wakers.
func BaseCause(ev *event.Event) Cause {
	switch ev.Kind {
	case event.KindMemcpy, event.KindMemcpyStaged:
		return CauseCUDAMemcpy
	case event.KindAlloc, event.KindFree:
		return CauseCUDAAlloc
	case event.KindGroupEnd:
		return CauseComm
	case event.KindSync:
		return CauseOther
	case event.KindRunqueue:
		return CauseCPUContention
	case event.KindOffCPU:
		if ev.Path != "" {
			return CauseIORead // fault on a mapped file
		}
		return CauseOther
	case event.KindSyscall:
		switch ev.Syscall {
		case event.SysRead:
			switch {
			case IsFile(ev):
				return CauseIORead
			case ev.FDKind == event.FDSocket:
				return CauseNet
			}
			return CauseOther
		case event.SysWrite:
			switch {
			case IsFile(ev):
				return CauseIOWrite
			case ev.FDKind == event.FDSocket:
				return CauseNet
			case ev.FDKind == event.FDPipe:
				// Writing into a pipe blocks while its reader lags
				// (stdout into a log collector): where the logs go is
				// what changes it; the tracer names the reader.
				return CauseIOWrite
			}
			return CauseOther
		case event.SysFsync:
			return CauseIOWrite
		case event.SysNet:
			return CauseNet
		case event.SysPoll:
			// A poll or select on sockets only (the tracer names one):
			// a socket with a timeout waits there, not in recv.
			if ev.FDKind == event.FDSocket {
				return CauseNet
			}
			return CauseOther
		case event.SysSleep:
			return CauseSleep
		case event.SysOther:
			if isChildWait(ev) {
				return CauseSubprocess
			}
		}
		return CauseOther
	}
	return CauseCPU
}

// pathOp reports whether ev is a call that wrote a file's name rather than
// its contents: a rename (os.replace of a temporary file over a checkpoint),
// an unlink, a truncate by path. The tracer gives it the path it named and
// no fd.
func PathOp(ev *event.Event) bool {
	return ev.Kind == event.KindSyscall && ev.Syscall == event.SysWrite && ev.FD < 0 && ev.Path != ""
}

func IsFile(ev *event.Event) bool {
	return ev.FDKind == event.FDFile || (ev.FDKind == event.FDUnknown && len(ev.Path) > 0 && ev.Path[0] == '/')
}

// isWait reports whether ev is a wait on another task (a channel, a lock,
// a readiness poll) rather than on a device or the network.
func isWait(ev *event.Event) bool {
	if ev.Kind != event.KindSyscall {
		return false
	}
	switch ev.Syscall {
	case event.SysFutex:
		return true
	case event.SysPoll:
		if ev.FDKind != event.FDSocket {
			// Pipes, eventfds, several kinds at once, an epoll set: a
			// readiness wait on another task.
			return true
		}
		// On sockets only: judged as a recv on that socket.
		fallthrough
	case event.SysRead, event.SysNet:
		if ev.PeerPID != 0 || ev.Name == "connect" {
			// A conversation with a known peer process (a loopback service)
			// or a connection attempt is the network.
			return false
		}
		switch ev.FDKind {
		case event.FDPipe, event.FDOther:
			return true
		case event.FDSocket:
			// A unix socket (no ip:port peer) is a local channel; a TCP/UDP
			// peer is the network even when it is a traced process. A
			// socket closed before it was resolved (no path) is taken for
			// the network, as an unresolved recv is.
			return ev.PeerAddr == "" && ev.Path != ""
		}
	}
	return false
}

func syscallName(ev *event.Event) string {
	if ev.Name != "" {
		return ev.Name
	}
	return ev.Syscall.String()
}

// opName names a blocking interval for HostOp and evidence.
func opName(ev *event.Event) string {
	switch ev.Kind {
	case event.KindSyscall:
		return syscallName(ev)
	case event.KindRunqueue:
		return "runqueue"
	case event.KindOffCPU:
		return "offcpu"
	case event.KindGroupEnd:
		return "ncclGroupEnd"
	case event.KindMemcpyStaged:
		return stagedName(ev)
	}
	if ev.CUDA != event.CUDANone {
		return ev.CUDA.String()
	}
	return ev.Kind.String()
}

// isChildWait reports whether ev is a wait for a child process to end
// (subprocess.run and os.system wait in wait4; waitid).
func isChildWait(ev *event.Event) bool {
	return ev.Kind == event.KindSyscall && (ev.Name == "wait4" || ev.Name == "waitid")
}
