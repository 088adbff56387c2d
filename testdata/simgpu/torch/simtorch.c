// simtorch: the one function of libtorch_cpu.so that gaptrace probes for
// framework step markers, under PyTorch's mangled name and with its
// argument layout:
//
//   torch::autograd::profiler::record_function_enter_new(
//       std::string const& name, std::optional<std::string> const& args)
//
// PyTorch enters it for every record_function region (the optimizer's
// "Optimizer.step#<Class>.step" even with the profiler off). Written in C
// (no C++ compiler needed to build the simulated GPU): the arguments are
// libstdc++'s std::string (data pointer, length, then a 16-byte local
// buffer or the capacity) and std::optional of one (the string, then the
// engaged flag), passed by reference as the C++ ABI passes them, after the
// return slot of the intrusive_ptr it returns (checked against PyTorch
// 2.11's libtorch_cpu.so: the name arrives in rsi, not rdi). A trainer
// driven from Python through ctypes calls sim_record_function(name), which
// builds the string and calls the function as PyTorch's binding does.
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

struct cxx_string {
	const char *ptr;
	size_t len;
	union {
		char local[16];
		size_t cap;
	} u;
};

struct cxx_optional_string {
	struct cxx_string value;
	bool engaged;
};

// The regions entered, so the call cannot be optimised away.
unsigned long sim_regions;

// c10::intrusive_ptr<PythonRecordFunction>, what the function returns: one
// pointer, but not trivially copyable, so the C++ ABI returns it through a
// slot whose address the caller passes first (rdi), ahead of the name.
struct intrusive_ptr {
	void *target;
};

__attribute__((noinline, visibility("default"))) void
sim_record_function_enter_new(struct intrusive_ptr *ret, const struct cxx_string *name,
			      const struct cxx_optional_string *args) __asm__(
	"_ZN5torch8autograd8profiler25record_function_enter_newERKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEERKSt8optionalIS7_E");

void sim_record_function_enter_new(struct intrusive_ptr *ret, const struct cxx_string *name,
				   const struct cxx_optional_string *args)
{
	__atomic_fetch_add(&sim_regions, name->len + (args->engaged ? args->value.len : 0), __ATOMIC_RELAXED);
	ret->target = &sim_regions;
}

__attribute__((visibility("default"))) void sim_record_function(const char *name)
{
	struct cxx_string s = {0};
	struct cxx_optional_string none = {0};
	char *heap = NULL;
	size_t n = strlen(name);
	if (n < sizeof(s.u.local)) {
		memcpy(s.u.local, name, n + 1);
		s.ptr = s.u.local;
	} else {
		heap = malloc(n + 1);
		if (heap == NULL)
			return;
		memcpy(heap, name, n + 1);
		s.ptr = heap;
		s.u.cap = n;
	}
	s.len = n;
	struct intrusive_ptr rec;
	sim_record_function_enter_new(&rec, &s, &none);
	free(heap);
}
