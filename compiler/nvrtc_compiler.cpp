#include "compiler/nvrtc_compiler.h"

#include <nvrtc.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cache/cache_key.h"
#include "common/error.h"
#include "compiler/embedded_templates.h"

namespace moejit {
namespace fs = std::filesystem;
namespace {

// Owns an nvrtcProgram; destroys it on every path out.
class Program {
 public:
  Program(const GeneratedUnit& unit) {
    const auto& files = embedded_templates();
    for (const auto& f : files) {
      contents_.emplace_back(f.contents);
      names_.emplace_back(f.name);
    }
    std::vector<const char*> headers, names;
    for (size_t i = 0; i < files.size(); ++i) {
      headers.push_back(contents_[i].c_str());
      names.push_back(names_[i].c_str());
    }
    std::string file_name = unit.name + ".cu";
    check(nvrtcCreateProgram(&program_, unit.source.c_str(), file_name.c_str(), static_cast<int>(headers.size()),
                             headers.data(), names.data()),
          "nvrtcCreateProgram");
  }
  ~Program() { nvrtcDestroyProgram(&program_); }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;

  nvrtcResult compile(const std::vector<std::string>& options) {
    std::vector<const char*> argv;
    for (const auto& o : options) argv.push_back(o.c_str());
    return nvrtcCompileProgram(program_, static_cast<int>(argv.size()), argv.data());
  }

  std::string log() {
    size_t size = 0;
    check(nvrtcGetProgramLogSize(program_, &size), "nvrtcGetProgramLogSize");
    std::string log(size, '\0');
    check(nvrtcGetProgramLog(program_, log.data()), "nvrtcGetProgramLog");
    while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    return log;
  }

  std::string cubin() {
    size_t size = 0;
    check(nvrtcGetCUBINSize(program_, &size), "nvrtcGetCUBINSize");
    std::string out(size, '\0');
    check(nvrtcGetCUBIN(program_, out.data()), "nvrtcGetCUBIN");
    return out;
  }

  std::string ptx() {
    size_t size = 0;
    check(nvrtcGetPTXSize(program_, &size), "nvrtcGetPTXSize");
    std::string out(size, '\0');
    check(nvrtcGetPTX(program_, out.data()), "nvrtcGetPTX");
    if (!out.empty() && out.back() == '\0') out.pop_back();
    return out;
  }

  static void check(nvrtcResult r, const char* what) {
    if (r != NVRTC_SUCCESS) throw Error(fmt::format("{} failed: {}", what, nvrtcGetErrorString(r)));
  }

 private:
  nvrtcProgram program_ = nullptr;
  std::vector<std::string> contents_, names_;
};

std::string quote_shell(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Writes the unit, the embedded headers and an nvcc command that reproduces the compile.
// Best effort: a failure to write returns "" and the error is still reported.
std::string write_repro(const GeneratedUnit& unit, const CompileOptions& options,
                        const std::vector<std::string>& flags, const std::string& log) {
  if (options.repro_dir.empty()) return "";
  std::string pattern = (fs::path(options.repro_dir) / fmt::format("moejit-repro-{}-XXXXXX", unit.name)).string();
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) return "";
  fs::path dir(buf.data());
  std::error_code ec;
  std::ofstream(dir / (unit.name + ".cu")) << unit.source;
  for (const auto& f : embedded_templates()) {
    fs::create_directories(dir / fs::path(std::string(f.name)).parent_path(), ec);
    std::ofstream(dir / std::string(f.name)) << f.contents;
  }
  std::ofstream(dir / "nvrtc.log") << log << "\n";
  std::ofstream(dir / "options.txt") << fmt::format("{}\n", fmt::join(flags, "\n"));
  // nvcc spells NVRTC's flags the same way except -default-device, which has no nvcc twin:
  // the templates mark their functions __device__, so dropping it changes nothing.
  std::string cmd = "#!/bin/sh\n# Reproduces the failed NVRTC compile with nvcc.\ncd \"$(dirname \"$0\")\"\n";
  cmd += fmt::format("nvcc -cubin -I. -I{}/include -I{}/include/cccl", quote_shell(options.cuda_home),
                     quote_shell(options.cuda_home));
  for (const auto& f : flags) {
    if (f == "-default-device") continue;
    if (f.starts_with("-arch=")) {
      std::string arch = f.substr(6);
      cmd += fmt::format(" -gencode=arch=compute_{0},code={1}", arch.substr(3), arch);
      continue;
    }
    cmd += " " + quote_shell(f);
  }
  cmd += fmt::format(" {}.cu -o {}.cubin\n", unit.name, unit.name);
  std::ofstream(dir / "repro.sh") << cmd;
  fs::permissions(dir / "repro.sh", fs::perms::owner_all, fs::perm_options::add, ec);
  return dir.string();
}

}  // namespace

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

std::vector<std::string> supported_archs() {
  int count = 0;
  nvrtcGetNumSupportedArchs(&count);
  std::vector<int> archs(count);
  if (count > 0) nvrtcGetSupportedArchs(archs.data());
  std::vector<std::string> out;
  for (int a : archs) {
    out.push_back(fmt::format("sm_{}", a));
    // Arch-specific features (wgmma, setmaxnreg on Hopper) exist from sm_90 on as the 'a' targets.
    if (a >= 90) out.push_back(fmt::format("sm_{}a", a));
  }
  return out;
}

void check_arch(const std::string& arch) {
  auto archs = supported_archs();
  if (std::find(archs.begin(), archs.end(), arch) == archs.end())
    throw InvalidInput(fmt::format("arch: '{}' is not supported by NVRTC {}; allowed values: {}", shown(arch),
                                   nvrtc_version(), fmt::join(archs, ", ")));
}

std::vector<std::string> compile_flags(const CompileOptions& options) {
  std::vector<std::string> flags = {
      "-arch=" + options.arch,
      "-default-device",
      "-std=c++17",
      // The ptxas report (registers, spills, stack) lands in the log, which meta.json keeps.
      "-Xptxas=-v",
  };
  if (options.lineinfo) flags.push_back("-lineinfo");
  return flags;
}

std::vector<std::string> include_dirs(const std::string& cuda_home) {
  fs::path home(cuda_home);
  std::vector<std::string> dirs;
  for (fs::path dir : {home / "include" / "cccl", home / "include"}) {
    std::error_code ec;
    if (fs::exists(dir / "cub" / "version.cuh", ec)) dirs.push_back(dir.string());
  }
  if (dirs.empty())
    throw Error(fmt::format("CUB headers not found under '{}' (looked for include/cccl/cub and include/cub); "
                            "set MOEJIT_CUDA_HOME or CUDA_HOME to a CUDA toolkit",
                            cuda_home));
  dirs.push_back((home / "include").string());
  return dirs;
}

std::string cccl_version(const std::string& cuda_home) {
  static const std::regex define(R"(#define\s+CCCL_VERSION\s+(\d+))");
  for (const auto& dir : include_dirs(cuda_home)) {
    std::ifstream in(fs::path(dir) / "cuda" / "std" / "__cccl" / "version.h");
    std::stringstream text;
    text << in.rdbuf();
    std::smatch m;
    std::string s = text.str();
    if (std::regex_search(s, m, define)) return m[1].str();
  }
  return "unknown";
}

const std::string& templates_digest() {
  static const std::string digest = [] {
    CacheKeyBuilder key;
    for (const auto& f : embedded_templates()) key.add(f.name, f.contents);
    return key.digest();
  }();
  return digest;
}

std::string numbered(const std::string& source) {
  std::istringstream in(source);
  std::string out;
  int n = 0;
  for (std::string line; std::getline(in, line);) out += fmt::format("{:>5} | {}\n", ++n, line);
  return out;
}

CompiledUnit compile_unit(const GeneratedUnit& unit, const CompileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  CompiledUnit out;
  std::vector<std::string> flags = compile_flags(options);
  std::vector<std::string> argv = flags;
  for (const auto& dir : include_dirs(options.cuda_home)) argv.push_back("-I" + dir);
  if (options.pch) argv.push_back("-pch");

  Program program(unit);
  nvrtcResult result = program.compile(argv);
  out.log = program.log();
  if (result != NVRTC_SUCCESS) {
    std::string repro = write_repro(unit, options, flags, out.log);
    throw CompileError(
        fmt::format("NVRTC could not compile unit '{}' (kernels: {}) for {}: {}\noptions: {}\nlog:\n{}\n"
                    "source:\n{}{}",
                    unit.name, fmt::join(unit.entries, ", "), options.arch, nvrtcGetErrorString(result),
                    fmt::join(argv, " "), out.log, numbered(unit.source),
                    repro.empty() ? "" : fmt::format("reproduce with: sh {}/repro.sh\n", repro)),
        repro);
  }
  out.cubin = program.cubin();
  out.options = flags;
  if (options.want_ptx) {
    // PTX needs a virtual target; compile once more for compute_XX(a).
    Program ptx_program(unit);
    std::vector<std::string> ptx_argv = argv;
    ptx_argv[0] = "-arch=compute_" + options.arch.substr(3);
    if (ptx_program.compile(ptx_argv) == NVRTC_SUCCESS) out.ptx = ptx_program.ptx();
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace moejit
