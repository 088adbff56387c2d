// simtorch: the one function of libtorch_cpu.so that gaptrace probes for
// framework step markers, with PyTorch's signature:
//
//   torch::autograd::profiler::record_function_enter_new(
//       std::string const& name, std::optional<std::string> const& args)
//
// PyTorch enters it for every record_function region (the optimizer's
// "Optimizer.step#<Class>.step" even with the profiler off). A trainer
// driven from Python through ctypes calls sim_record_function(name),
// which builds the std::string and calls it as PyTorch's Python binding
// does.
#include <atomic>
#include <optional>
#include <string>

namespace torch {
namespace autograd {
namespace profiler {

// The regions entered, so the call cannot be optimised away.
std::atomic<unsigned long> sim_regions{0};

__attribute__((noinline, visibility("default"))) void
record_function_enter_new(const std::string &name, const std::optional<std::string> &args)
{
	sim_regions.fetch_add(name.size() + (args ? args->size() : 0), std::memory_order_relaxed);
}

} // namespace profiler
} // namespace autograd
} // namespace torch

extern "C" __attribute__((visibility("default"))) void sim_record_function(const char *name)
{
	std::string s(name);
	std::optional<std::string> none;
	torch::autograd::profiler::record_function_enter_new(s, none);
}
