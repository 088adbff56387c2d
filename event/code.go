package event

import (
	"path/filepath"
	"regexp"
	"strings"
)

// Whose code a file is. The tracer reads DWARF line tables only of the
// job's own binaries, and a gap is charged to the innermost frame of the
// job's own code: both ask SystemCode, so that a file is never the job's
// for one and a library's for the other.

// systemDirs are where distributions, CUDA and conda put code that no job
// writes itself.
var systemDirs = []string{
	"/usr/lib/", "/usr/lib64/", "/lib/", "/lib64/", "/usr/libexec/", "/usr/share/",
	"/usr/local/cuda", "/usr/local/nvidia", "/opt/nvidia/", "/opt/conda/",
}

// systemSegments mark installed code anywhere in a path: a virtual
// environment's or user install's packages, the standard library's
// extension modules, and the conda distributions' install trees.
var systemSegments = []string{
	"/site-packages/", "/dist-packages/", "/lib-dynload/",
	"/miniconda3/", "/anaconda3/", "/miniforge3/", "/mambaforge/",
}

// pyLibDir is a Python installation's library directory, whatever its
// prefix (/usr/local, pyenv, conda, a virtual environment): the standard
// library, its extension modules and the installed packages.
var pyLibDir = regexp.MustCompile(`/lib(64)?/python\d+\.\d+t?/`)

// interpreterExe is a Python interpreter's executable: python, python3,
// python3.12, python3.13t.
var interpreterExe = regexp.MustCompile(`^python(\d+(\.\d+)?t?)?$`)

// systemLibs are the file name prefixes of the shared libraries a job
// loads from wherever its environment keeps them (a wheel's bundled
// libraries, a conda env's lib/, LD_LIBRARY_PATH).
var systemLibs = []string{
	"libpython", "libc.", "libc-", "libm.", "libpthread", "libdl.", "librt.", "ld-linux", "libstdc++", "libgcc_s",
	"libgomp", "libffi", "libcuda", "libcudart", "libnccl", "libcublas", "libcudnn", "libnvrtc", "libnvidia-",
	"libtorch", "libc10",
}

// SystemCode reports whether file, a native frame's ELF path or a Python
// frame's source file, is code the job runs but did not write: the C and
// C++ runtimes, the CUDA and NCCL libraries, the Python interpreter, its
// standard library and installed packages (site-packages of the system, a
// virtual environment or conda), and Python code without a file of its
// own ("<frozen importlib._bootstrap>", "<string>"). An empty file is
// unknown code, not the job's. Everything else (a script, a binary or library of the job's own
// tree) is the job's.
func SystemCode(file string) bool {
	if file == "" || strings.HasPrefix(file, "<") {
		return true
	}
	for _, p := range systemDirs {
		if strings.HasPrefix(file, p) {
			return true
		}
	}
	for _, s := range systemSegments {
		if strings.Contains(file, s) {
			return true
		}
	}
	if pyLibDir.MatchString(file) {
		return true
	}
	base := filepath.Base(file)
	if interpreterExe.MatchString(base) {
		return true
	}
	for _, p := range systemLibs {
		if strings.HasPrefix(base, p) {
			return true
		}
	}
	return false
}
