#include "runtime/nccl.h"

#include <dlfcn.h>

#include <variant>

#include <fmt/format.h>

#include "common/error.h"
#include "common/knobs.h"

namespace moejit {
namespace {

template <typename F>
void resolve(void* handle, const std::string& path, const char* name, F& member) {
  member = reinterpret_cast<F>(dlsym(handle, name));
  if (!member) {
    dlclose(handle);
    throw Error(fmt::format("{} has no symbol {}: is it NCCL?", path, name));
  }
}

}  // namespace

NcclLibrary load_nccl_library(const std::string& path, bool knob_set) {
  NcclLibrary nccl;
  nccl.path = path;
  // RTLD_LOCAL: moejit calls NCCL through these pointers only.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    throw Error(fmt::format(
        "NCCL could not be loaded: dlopen({}) failed: {}. {}", path, e ? e : "no reason given",
        knob_set ? "MOEJIT_NCCL_LIBRARY names it; point it at an NCCL 2 library (libnccl.so.2)"
                 : "Set MOEJIT_NCCL_LIBRARY to libnccl.so.2's path (pip's nvidia-nccl-cu13 has it under "
                   "site-packages/nvidia/nccl/lib/), or add its folder to LD_LIBRARY_PATH"));
  }
  resolve(handle, path, "ncclGetVersion", nccl.get_version);
  resolve(handle, path, "ncclGetErrorString", nccl.get_error_string);
  resolve(handle, path, "ncclCommCount", nccl.comm_count);
  resolve(handle, path, "ncclCommUserRank", nccl.comm_user_rank);
  resolve(handle, path, "ncclCommCuDevice", nccl.comm_cu_device);
  resolve(handle, path, "ncclAllReduce", nccl.all_reduce);
  // NCCL 2.7 and later: only the all_to_all mode needs them (require_point_to_point).
  nccl.group_start = reinterpret_cast<decltype(nccl.group_start)>(dlsym(handle, "ncclGroupStart"));
  nccl.group_end = reinterpret_cast<decltype(nccl.group_end)>(dlsym(handle, "ncclGroupEnd"));
  nccl.send = reinterpret_cast<decltype(nccl.send)>(dlsym(handle, "ncclSend"));
  nccl.recv = reinterpret_cast<decltype(nccl.recv)>(dlsym(handle, "ncclRecv"));
  resolve(handle, path, "ncclCommInitAll", nccl.comm_init_all);
  resolve(handle, path, "ncclCommDestroy", nccl.comm_destroy);
  if (nccl.get_version(&nccl.version) != nccl::kSuccess || nccl.version < 20000) {
    const int version = nccl.version;
    dlclose(handle);
    throw Error(fmt::format("{} reports NCCL version {}; moejit needs NCCL 2 (libnccl.so.2)", path, version));
  }
  nccl.handle = handle;
  return nccl;
}

void close_nccl_library(NcclLibrary& nccl) {
  if (nccl.handle) dlclose(nccl.handle);
  nccl = NcclLibrary{};
}

namespace {

// The process's table, or why there is none.
using Loaded = std::variant<NcclLibrary, std::string>;

// The file of the NCCL whose ncclAllReduce the process exports globally (linked by the program, or
// loaded RTLD_GLOBAL), if any.
std::string exported_nccl() {
  void* symbol = dlsym(RTLD_DEFAULT, "ncclAllReduce");
  Dl_info info{};
  if (!symbol || !dladdr(symbol, &info) || !info.dli_fname || !*info.dli_fname) return {};
  return info.dli_fname;
}

Loaded load_once() {
  const std::string& knob = knobs().nccl_library;
  try {
    if (!knob.empty()) return load_nccl_library(knob, true);
    const std::string exported = exported_nccl();
    return load_nccl_library(exported.empty() ? "libnccl.so.2" : exported, false);
  } catch (const Error& e) {
    return std::string(e.what());
  }
}

}  // namespace

const NcclLibrary& nccl_library() {
  static const Loaded loaded = load_once();
  if (const auto* why = std::get_if<std::string>(&loaded)) throw Error(*why);
  return std::get<NcclLibrary>(loaded);
}

void require_point_to_point(const NcclLibrary& nccl) {
  if (!nccl.group_start || !nccl.group_end || !nccl.send || !nccl.recv)
    throw Error(fmt::format("{} (NCCL {}) has no ncclSend / ncclRecv / ncclGroupStart / ncclGroupEnd; ep_mode "
                            "all_to_all needs NCCL 2.7 or later",
                            nccl.path, nccl.version));
}

int nccl_type(DType dtype) {
  switch (dtype) {
    case DType::BF16: return nccl::kBfloat16;
    case DType::FP16: return nccl::kFloat16;
    case DType::FP32: return nccl::kFloat32;
  }
  throw Error("moejit internal error: a dtype NCCL has no type for");
}

void check_nccl(int result, const char* what) {
  if (result == nccl::kSuccess) return;
  if (result == nccl::kInProgress)
    throw Error(fmt::format("{}: NCCL returned ncclInProgress: the communicator is non-blocking; moejit needs a "
                            "blocking one (NCCL's default: config.blocking = 1)",
                            what));
  const char* message = nccl_library().get_error_string(result);
  throw Error(fmt::format("{}: NCCL error {} ({})", what, result, message ? message : "no message"));
}

}  // namespace moejit
