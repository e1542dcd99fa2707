// One disk cache entry's contents (disk_cache.h has the layout around it): the names an entry
// may have, its three files, and meta.json, which records the arch, the key, the SHA-256 of
// kernel.cubin and kernel.cu, the kernel names and free-form info. Reading checks all of it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "cache/cached_binary.h"

namespace moejit::disk_entry {

inline constexpr const char* kSource = "kernel.cu";
inline constexpr const char* kCubin = "kernel.cubin";
inline constexpr const char* kMeta = "meta.json";
// What an entry's files may hold; a larger one is a bad entry (quarantined), never read whole.
// One layer's largest unit (the experts' GEMMs) is a few MB of cubin and source.
inline constexpr size_t kMaxBinaryBytes = size_t{256} << 20;
inline constexpr size_t kMaxMetaBytes = size_t{1} << 20;

// Arch and key become path components: only [0-9A-Za-z_-], so never ".", "..", "/" or a dot
// that would make the tmp/quarantine names ambiguous. Arch may not shadow the service folders.
bool valid_arch(std::string_view arch);
bool valid_key(std::string_view key);

// Writes the entry's three files (each fsynced) into the opened, empty folder `dirfd`, whose
// path is `dir` (for messages). Returns "" or why it failed. A crash or a failure leaves some of
// the files, possibly one half written: write only into a folder no reader looks at.
std::string write_entry(int dirfd, const std::string& dir, const CachedBinary& binary);

// What reading one entry found.
struct EntryRead {
  enum Status { Ok, Refused, Corrupt } status = Corrupt;
  std::string why;
  CachedBinary binary;
};

// Reads and checks an opened entry folder: trust of each file (Refused when one is not this
// user's or is writable by others), meta.json, both digests, and that the entry is really the
// one asked for (a folder renamed to another key's path is Corrupt). Files are read relative to
// `dirfd`, so a concurrent rename of the folder cannot mix two entries.
EntryRead read_entry(int dirfd, const std::string& arch, const std::string& key);

// The kernel names meta.json lists, for display only (verify() checks entries); empty when
// meta.json is missing, untrusted or not a JSON object.
std::vector<std::string> kernel_names(int dirfd);

}  // namespace moejit::disk_entry
