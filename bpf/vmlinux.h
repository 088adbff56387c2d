/* Minimal kernel type definitions for gaptrace's BPF programs.
 *
 * Only what the programs touch is declared. Every struct carries
 * preserve_access_index, so field offsets are relocated against the running
 * kernel's BTF at load time (CO-RE): the layouts below need the right field
 * names and types, not the right offsets. Keeping this file small (instead of
 * a full `bpftool btf dump` of one kernel) keeps the build reproducible on CI.
 */
#ifndef __VMLINUX_H__
#define __VMLINUX_H__

typedef unsigned char __u8;
typedef signed char __s8;
typedef unsigned short __u16;
typedef short __s16;
typedef unsigned int __u32;
typedef int __s32;
typedef unsigned long long __u64;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;
typedef int pid_t;
enum { false = 0, true = 1 };

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_STACK_TRACE = 7,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
};

enum {
	BPF_RB_NO_WAKEUP = 1,
	BPF_RB_FORCE_WAKEUP = 2,
};

enum {
	BPF_RB_AVAIL_DATA = 0,
};

enum {
	BPF_F_USER_STACK = 256,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
	BPF_EXIST = 2,
};

/* x86-64 register file as the kernel names it (bpf_tracing.h reads these
 * names when __VMLINUX_H__ is defined). */
struct pt_regs {
	unsigned long r15;
	unsigned long r14;
	unsigned long r13;
	unsigned long r12;
	unsigned long bp;
	unsigned long bx;
	unsigned long r11;
	unsigned long r10;
	unsigned long r9;
	unsigned long r8;
	unsigned long ax;
	unsigned long cx;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long cs;
	unsigned long flags;
	unsigned long sp;
	unsigned long ss;
} __attribute__((preserve_access_index));

/* A perf_event program's context (uapi/linux/bpf_perf_event.h): the
 * sampled registers, the period, and the event's data address (for a
 * software page-fault event, the faulting address). */
struct bpf_perf_event_data {
	struct pt_regs regs;
	__u64 sample_period;
	__u64 addr;
};

struct trace_entry {
	unsigned short type;
	unsigned char flags;
	unsigned char preempt_count;
	int pid;
} __attribute__((preserve_access_index));

struct trace_event_raw_sys_enter {
	struct trace_entry ent;
	long id;
	unsigned long args[6];
} __attribute__((preserve_access_index));

struct trace_event_raw_sys_exit {
	struct trace_entry ent;
	long id;
	long ret;
} __attribute__((preserve_access_index));

struct ns_common {
	unsigned int inum;
} __attribute__((preserve_access_index));

struct pid_namespace {
	unsigned int level;
	struct ns_common ns;
} __attribute__((preserve_access_index));

struct upid {
	int nr;
	struct pid_namespace *ns;
} __attribute__((preserve_access_index));

/* numbers[] is a flexible array of level + 1 entries, outermost first. */
struct pid {
	unsigned int level;
	struct upid numbers[1];
} __attribute__((preserve_access_index));

/* A file system instance: s_magic names its type (tmpfs, ramfs, ...). */
struct super_block {
	unsigned long s_magic;
} __attribute__((preserve_access_index));

struct inode {
	unsigned short i_mode;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

/* A file's page cache (the filemap fault tracepoints). */
struct address_space {
	struct inode *host;
} __attribute__((preserve_access_index));

/* A mapping of a process's address space (bpf_find_vma's callback). */
struct vm_area_struct {
	struct file *vm_file;
} __attribute__((preserve_access_index));

struct fdtable {
	unsigned int max_fds;
	struct file **fd;
} __attribute__((preserve_access_index));

struct files_struct {
	struct fdtable *fdt;
} __attribute__((preserve_access_index));

struct task_struct {
	unsigned int __state;
	pid_t pid;
	pid_t tgid;
	char comm[16];
	struct pid *thread_pid;
	struct task_struct *group_leader;
	struct files_struct *files;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

#endif /* __VMLINUX_H__ */
