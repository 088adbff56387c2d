//go:build ignore

#include "cuda_internal.h"

API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	if (module == NULL || image == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (!initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	struct CUmod_st *m = malloc(sizeof(*m));
	if (m == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->magic = MAGIC_MOD;
	*module = m;
	return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(CUmodule hmod)
{
	if (hmod == NULL || hmod->magic != MAGIC_MOD)
		return CUDA_ERROR_INVALID_HANDLE;
	hmod->magic = 0;
	free(hmod);
	return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	if (hfunc == NULL || name == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (hmod == NULL || hmod->magic != MAGIC_MOD)
		return CUDA_ERROR_INVALID_HANDLE;
	struct CUfunc_st *f = malloc(sizeof(*f));
	if (f == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	f->magic = MAGIC_FUNC;
	f->dur_ns = cfg_kernel_ns;
	const char *prefix = "sim_kernel_";
	if (strncmp(name, prefix, strlen(prefix)) == 0) {
		char *end;
		unsigned long long us = strtoull(name + strlen(prefix), &end, 10);
		if (*end == '\0' && end != name + strlen(prefix))
			f->dur_ns = us * 1000ull;
	}
	*hfunc = f;
	return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ */
/* Launches                                                            */

API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
			    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
			    unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
			    void **kernelParams, void **extra)
{
	return launch(f, hStream, 0);
}

API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				 unsigned int gridDimZ, unsigned int blockDimX,
				 unsigned int blockDimY, unsigned int blockDimZ,
				 unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
				 void **extra)
{
	return launch(f, hStream, 1);
}

API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
			      void **extra)
{
	return launch_ex(config, f, 0);
}

API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
				   void **kernelParams, void **extra)
{
	return launch_ex(config, f, 1);
}

API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
				       unsigned int gridDimZ, unsigned int blockDimX,
				       unsigned int blockDimY, unsigned int blockDimZ,
				       unsigned int sharedMemBytes, CUstream hStream,
				       void **kernelParams)
{
	return launch(f, hStream, 0);
}

API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
					    unsigned int gridDimY, unsigned int gridDimZ,
					    unsigned int blockDimX, unsigned int blockDimY,
					    unsigned int blockDimZ, unsigned int sharedMemBytes,
					    CUstream hStream, void **kernelParams)
{
	return launch(f, hStream, 1);
}

API CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
	if (phGraph == NULL || flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	struct CUgraph_st *g = malloc(sizeof(*g));
	if (g == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	g->magic = MAGIC_GRAPH;
	*phGraph = g;
	return CUDA_SUCCESS;
}

API CUresult cuGraphDestroy(CUgraph hGraph)
{
	if (hGraph == NULL || hGraph->magic != MAGIC_GRAPH)
		return CUDA_ERROR_INVALID_HANDLE;
	hGraph->magic = 0;
	free(hGraph);
	return CUDA_SUCCESS;
}

API CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
					 unsigned long long flags)
{
	if (phGraphExec == NULL)
		return CUDA_ERROR_INVALID_VALUE;
	if (hGraph == NULL || hGraph->magic != MAGIC_GRAPH)
		return CUDA_ERROR_INVALID_HANDLE;
	struct CUgraphExec_st *e = malloc(sizeof(*e));
	if (e == NULL)
		return CUDA_ERROR_OUT_OF_MEMORY;
	e->magic = MAGIC_GEXEC;
	e->dur_ns = cfg_graph_ns;
	*phGraphExec = e;
	return CUDA_SUCCESS;
}

API CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
	if (hGraphExec == NULL || hGraphExec->magic != MAGIC_GEXEC)
		return CUDA_ERROR_INVALID_HANDLE;
	hGraphExec->magic = 0;
	free(hGraphExec);
	return CUDA_SUCCESS;
}

API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	return graph_launch(hGraphExec, hStream, 0);
}

API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	return graph_launch(hGraphExec, hStream, 1);
}
