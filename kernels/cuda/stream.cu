// The stream dsq_cuda_* launches go to: one per calling thread, so the
// engine thread's backend (engine/backend/backend_cuda.c) sets its own
// stream once per op without a stream argument in every launcher (which
// keeps each launcher's signature that of its CPU twin).
#include "cuda_internal.cuh"

static thread_local cudaStream_t current_stream = 0;

cudaStream_t dsq__cuda_stream(void) { return current_stream; }

extern "C" void dsq_cuda_set_stream(dsq_cuda_stream_t *s)
{
    current_stream = (cudaStream_t)s;
}

extern "C" dsq_cuda_stream_t *dsq_cuda_get_stream(void)
{
    return (dsq_cuda_stream_t *)current_stream;
}
