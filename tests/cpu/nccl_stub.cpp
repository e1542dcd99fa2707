// A stand-in for libnccl.so.2, for tests/cpu/reduced_layer_test.cpp on a machine without a GPU: a
// communicator is a number that encodes its ranks, rank and device, and ncclAllReduce, ncclSend,
// ncclRecv and the group calls record their arguments and move nothing, so the tests can check what
// the expert-parallel layers ask NCCL to do.
#include "nccl_stub.h"

#include <cstddef>
#include <cstdint>

extern "C" {

namespace {
constexpr int kMaxCalls = 1024;
StubCall calls[kMaxCalls];
int call_count = 0;

// comm = (ranks << 16) | (rank << 8) | device
int field(void* comm, int shift) { return static_cast<int>((reinterpret_cast<uintptr_t>(comm) >> shift) & 0xff); }

void record(const StubCall& call) {
  if (call_count < kMaxCalls) calls[call_count++] = call;
}
}  // namespace

int ncclGetVersion(int* version) {
  *version = 22800;
  return 0;
}
const char* ncclGetErrorString(int) { return "stub NCCL error"; }
int ncclCommCount(void* comm, int* count) {
  *count = field(comm, 16);
  return 0;
}
int ncclCommUserRank(void* comm, int* rank) {
  *rank = field(comm, 8);
  return 0;
}
int ncclCommCuDevice(void* comm, int* device) {
  *device = field(comm, 0);
  return 0;
}
int ncclAllReduce(const void* send, void* recv, size_t count, int datatype, int op, void* comm, void* stream) {
  record({"ncclAllReduce", send, recv, count, datatype, op, -1, comm, stream});
  return 0;
}
int ncclSend(const void* send, size_t count, int datatype, int peer, void* comm, void* stream) {
  record({"ncclSend", send, nullptr, count, datatype, -1, peer, comm, stream});
  return 0;
}
int ncclRecv(void* recv, size_t count, int datatype, int peer, void* comm, void* stream) {
  record({"ncclRecv", nullptr, recv, count, datatype, -1, peer, comm, stream});
  return 0;
}
int ncclGroupStart() {
  record({"ncclGroupStart", nullptr, nullptr, 0, -1, -1, -1, nullptr, nullptr});
  return 0;
}
int ncclGroupEnd() {
  record({"ncclGroupEnd", nullptr, nullptr, 0, -1, -1, -1, nullptr, nullptr});
  return 0;
}
int ncclCommInitAll(void**, int, const int*) { return 5; }  // ncclInvalidUsage: the stub makes none
int ncclCommDestroy(void*) { return 0; }

// What the test reads back: the calls so far (and forgets them with reset).
int moejit_nccl_stub_calls(const StubCall** out) {
  *out = calls;
  return call_count;
}
void moejit_nccl_stub_reset() { call_count = 0; }

}  // extern "C"
