/* A downstream C program on the installed braid::nccl: two communicators of this process
 * (ncclCommInitAll) all-reduce host buffers in one group. */
#include <braid/nccl.h>

#include <stdio.h>

int main(void) {
  ncclComm_t comms[2];
  float a[3] = {1, 2, 3}, b[3] = {10, 20, 30};
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version < 22800) return 1;
  if (ncclCommInitAll(comms, 2, NULL) != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  ncclGroupStart();
  ncclAllReduce(a, a, 3, ncclFloat, ncclSum, comms[0], NULL);
  ncclAllReduce(b, b, 3, ncclFloat, ncclSum, comms[1], NULL);
  if (ncclGroupEnd() != ncclSuccess) {
    fprintf(stderr, "ncclGroupEnd: %s\n", ncclGetLastError(NULL));
    return 1;
  }
  ncclCommDestroy(comms[0]);
  ncclCommDestroy(comms[1]);
  if (a[2] != 33 || b[0] != 11) return 1;
  printf("nccl_consumer: ok (NCCL API %d)\n", version);
  return 0;
}
