/* CuteDSLRT_TVMFFISetRaisedCudaError: the one runtime symbol that objects exported by
   nvidia-cutlass-dsl 4.7.0 need and 4.6.2's libcute_dsl_runtime.so lacks (same behaviour as 4.7.0's). */
#include <stdio.h>
typedef void (*set_raised_parts_t)(const char *kind, const char **parts, int n);
void CuteDSLRT_TVMFFISetRaisedCudaError(set_raised_parts_t set, int err) {
  if (!set) return;
  char code[32];
  snprintf(code, sizeof code, "%d", err);
  const char *parts[2] = {"CUDA Error Code: ", code};
  set("CUDADialectError", parts, 2);
}
