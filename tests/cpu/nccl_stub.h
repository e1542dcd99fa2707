// What the stand-in NCCL (nccl_stub.cpp) records of each ncclAllReduce, as reduced_layer_test.cpp
// reads it back through moejit_nccl_stub_calls.
#pragma once

#include <cstddef>

extern "C" struct StubAllReduce {
  const void* send;
  void* recv;
  size_t count;
  int datatype;
  int op;
  void* comm;
  void* stream;
};
