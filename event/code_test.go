package event

import "testing"

func TestSystemCode(t *testing.T) {
	for _, c := range []struct {
		file   string
		system bool
	}{
		// The C runtime and the distribution's libraries.
		{"/usr/lib/x86_64-linux-gnu/libc.so.6", true},
		{"/lib/x86_64-linux-gnu/libpthread.so.0", true},
		{"/lib64/ld-linux-x86-64.so.2", true},
		{"/usr/lib64/libstdc++.so.6.0.32", true},
		// CUDA, wherever it is installed or bundled.
		{"/usr/local/cuda-12.4/lib64/libcudart.so.12", true},
		{"/usr/local/nvidia/lib64/libcuda.so.1", true},
		{"/home/u/train/build/simgpu/libcuda.so.1", true},
		{"/home/u/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so", true},
		{"/opt/wheels/torch/lib/libtorch_cuda.so", true},
		{"/opt/wheels/torch/lib/libc10_cuda.so", true},
		{"/usr/lib/x86_64-linux-gnu/libnccl.so.2", true},
		{"/workspace/nvidia/lib/libnccl.so.2.21.5", true},
		// Installed packages: the system's, a virtual environment's, a
		// user install's, conda's.
		{"/usr/lib/python3/dist-packages/numpy/core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so", true},
		{"/usr/local/lib/python3.10/dist-packages/torch/serialization.py", true},
		{"/home/u/.venv/lib/python3.12/site-packages/torch/utils/data/dataloader.py", true},
		{"/root/.local/lib/python3.11/site-packages/tqdm/std.py", true},
		{"/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", true},
		{"/home/u/miniconda3/envs/train/lib/libgomp.so.1", true},
		{"/opt/conda/lib/libffi.so.8", true},
		// The interpreter and its standard library, of every prefix.
		{"/usr/lib/python3.12/threading.py", true},
		{"/usr/local/lib/python3.11/threading.py", true},
		{"/opt/conda/lib/python3.11/selectors.py", true},
		{"/root/.pyenv/versions/3.11.7/lib/python3.11/os.py", true},
		{"/root/.pyenv/versions/3.11.7/lib/python3.11/lib-dynload/_socket.cpython-311-x86_64-linux-gnu.so", true},
		{"/root/.pyenv/versions/3.13.0/lib/python3.13t/queue.py", true},
		{"/root/.pyenv/versions/3.11.7/lib/libpython3.11.so.1.0", true},
		{"/root/.pyenv/versions/3.12.1/bin/python3.12", true},
		{"/usr/bin/python3.11", true},
		{"/usr/local/bin/python3", true},
		{"/home/u/venv/bin/python", true},
		{"<frozen importlib._bootstrap>", true},
		{"<frozen runpy>", true},
		{"<string>", true},
		{"", true},
		// The job's own code: its scripts, binaries and libraries.
		{"/home/u/train/simtrain", false},
		{"/home/u/train/build/libkernels.so", false},
		{"/workspace/train.py", false},
		{"/workspace/lib/data.py", false},
		{"/job/models/python_utils.py", false},
		{"/home/u/pythonic/train.py", false},
		{"/srv/python3-jobs/train.py", false},
		{"/home/u/libraries/loader.py", false},
		{"/tmp/pytrain.py", false},
		{"train.py", false},
	} {
		if got := SystemCode(c.file); got != c.system {
			t.Errorf("SystemCode(%q) = %v, want %v", c.file, got, c.system)
		}
	}
}
