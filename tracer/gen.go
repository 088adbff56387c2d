package tracer

// The BPF objects are generated from bpf/*.c and committed, so building
// gaptrace needs no clang. `make generate` reruns these.

//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type event_hdr -type cuda_event -type short_key -type thread_state cuda ../bpf/cuda.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type nccl_event nccl ../bpf/nccl.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type syscall_event -type fd_event syscalls ../bpf/syscalls.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type sched_event -type proc_event sched ../bpf/sched.c -- -I../bpf
