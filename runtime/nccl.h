// NCCL, loaded at run time with dlopen (DESIGN.md decision 13), as the driver is: nothing links
// NCCL, and a process that never gives a layer a communicator never loads it. The few types and
// constants moejit passes are declared here with NCCL's own values (the ABI of libnccl.so.2, stable
// across its 2.x releases; tests/cpu/test_nccl.cpp checks them against nccl.h where one is
// installed), so building moejit needs no NCCL header either.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <string>

#include "compiler/moe_config.h"

struct ncclComm;  // NCCL's opaque communicator (nccl.h's ncclComm_t is a pointer to it)

namespace moejit {
namespace nccl {

using Comm = ::ncclComm*;  // ncclComm_t: the caller's communicator

// ncclResult_t, ncclDataType_t and ncclRedOp_t are C enums: int-sized.
constexpr int kSuccess = 0;     // ncclSuccess
constexpr int kInProgress = 7;  // ncclInProgress (a non-blocking communicator still working)
constexpr int kUint8 = 1;       // ncclUint8
constexpr int kInt32 = 2;       // ncclInt32
constexpr int kFloat16 = 6;     // ncclFloat16
constexpr int kFloat32 = 7;     // ncclFloat32
constexpr int kBfloat16 = 9;    // ncclBfloat16
constexpr int kSum = 0;         // ncclSum

}  // namespace nccl

struct NcclLibrary {
  std::string path;  // what dlopen was given
  int version = 0;   // ncclGetVersion's, e.g. 22809 for 2.28.9
  void* handle = nullptr;  // dlopen's; the pointers below are into it

  int (*get_version)(int* version) = nullptr;
  const char* (*get_error_string)(int result) = nullptr;
  int (*comm_count)(nccl::Comm comm, int* count) = nullptr;
  int (*comm_user_rank)(nccl::Comm comm, int* rank) = nullptr;
  int (*comm_cu_device)(nccl::Comm comm, int* device) = nullptr;
  int (*all_reduce)(const void* send, void* recv, size_t count, int datatype, int op, nccl::Comm comm,
                    CUstream stream) = nullptr;
  // The all_to_all mode's exchanges (NCCL 2.7 and later; null in an older NCCL, whose all_reduce
  // mode still works): point-to-point sends and receives, grouped so that they run as one operation.
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
  int (*send)(const void* buffer, size_t count, int datatype, int peer, nccl::Comm comm, CUstream stream) = nullptr;
  int (*recv)(void* buffer, size_t count, int datatype, int peer, nccl::Comm comm, CUstream stream) = nullptr;
  // moejit never creates a communicator; the GPU tests make single-process ones with these.
  int (*comm_init_all)(nccl::Comm* comms, int count, const int* devices) = nullptr;
  int (*comm_destroy)(nccl::Comm comm) = nullptr;
};

// Loads NCCL from `path` (a file path or a soname dlopen searches for): the table, or Error saying
// what failed (`knob_set`: the path came from MOEJIT_NCCL_LIBRARY, which the message then names).
// Each call opens the library once more (dlopen counts); close_nccl_library releases a table this
// returned. nccl_library() below keeps one for the process.
NcclLibrary load_nccl_library(const std::string& path, bool knob_set);
void close_nccl_library(NcclLibrary& nccl);

// The process-wide table, loaded on first use. It must be the NCCL that created the caller's
// communicator (a communicator handed to a second copy of NCCL is undefined behaviour), so, in order:
// MOEJIT_NCCL_LIBRARY when it is set (the caller says which); else the NCCL whose ncclAllReduce the
// process already exports (an engine that links NCCL); else libnccl.so.2, which is the copy the
// process has loaded already under that name (e.g. torch's) or the loader's. Throws Error saying
// what failed: the library not found (and how to point moejit at one), a symbol missing, or a
// version before 2.0. The outcome is kept: a later call fails the same way without retrying.
const NcclLibrary& nccl_library();

// Throws Error naming the library and its version when it lacks the point-to-point calls.
void require_point_to_point(const NcclLibrary& nccl);

// NCCL's data type of a model dtype.
int nccl_type(DType dtype);

// Throws Error "<what>: NCCL error <n> (<NCCL's message>)" unless result is ncclSuccess; for
// ncclInProgress it says that moejit needs a blocking communicator (NCCL's default).
void check_nccl(int result, const char* what);

}  // namespace moejit
