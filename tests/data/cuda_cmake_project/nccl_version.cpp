#include <cstdio>
#include <nccl.h>
int main() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) return 1;  // header == library
  std::printf("%d.%d.%d", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  return 0;
}
