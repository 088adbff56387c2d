package tracer

// The BPF objects are generated from bpf/*.c and committed, so building
// gaptrace needs no clang. `make generate` reruns these. Every struct and
// enum user space shares with the programs is named here (-type), so Go
// uses bpf2go's types and constants instead of copies; enums_test.go checks
// the few values the C side copies from package event.

//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type event_hdr -type cuda_event -type short_key -type thread_state -type event_type -type event_kind -type launch_layout -type async_layout -type block_layout -type cuda_func -type py_offsets -type py_stack_event -type py_flags -type py_stat -type launch_fn_key -type launch_fn cuda ../bpf/cuda.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type nccl_event -type nccl_op nccl ../bpf/nccl.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type syscall_event -type syscall_path_event -type fd_event -type syscall_class -type syscall_class_bits syscalls ../bpf/syscalls.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type sched_event -type proc_event -type sched_flags -type proc_flags sched ../bpf/sched.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type cpu_sample_event -type fault_read_event profile ../bpf/profile.c -- -I../bpf
//go:generate go tool bpf2go -tags linux -target amd64 -cflags "-O2 -g -Wall -Werror" -type marker_event -type marker_kind -type event_hdr -type event_type -type event_kind marker ../bpf/marker.c -- -I../bpf
