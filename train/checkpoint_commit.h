// The inside of checkpoint writing, shared by train/checkpoint.cpp (the format:
// write_checkpoint, read_checkpoint, resolve_checkpoint) and
// train/checkpoint_manager.cpp (a run's retention): the file names and
// marks and the atomic commit (a temp directory, fsyncs, one rename), each of
// whose steps is a "checkpoint" point of core/fault.h, where tests and
// scripts/soak.sh crash a write. Not for use outside train/.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/json.h"
#include "core/tensor.h"

namespace forge::train::checkpoint_detail {

namespace fs = std::filesystem;

constexpr const char* kFiles[] = {"model.safetensors", "optimizer.safetensors", "state.json"};

// The optimizer.safetensors __metadata__ key of state.json's XXH3-64; the
// tensors' own checksums are the safetensors layer's.
constexpr const char* kStateChecksumKey = "state_json_xxh3_64";
// What the small files may hold, read with these caps so a damaged or hostile
// one cannot take the memory: a state is a few KB, a pointer one name.
constexpr size_t kMaxStateBytes = size_t{16} << 20;
constexpr size_t kMaxPointerBytes = 4096;

// The suffixes of what a write leaves beside its target until it finishes:
// the directory being built, an old directory renamed aside, one being deleted.
constexpr std::string_view kTmpMark = ".tmp-", kOldMark = ".old-", kDelMark = ".del-";

std::string pid_suffix();  // this process's id, for temp names

// Whether the commit renames with RENAME_EXCHANGE (set_checkpoint_rename_exchange).
extern std::atomic<bool> g_rename_exchange;
// One write step named `what`: a "checkpoint" point of core/fault.h.
void step(std::string_view what);

// ---- files and the atomic commit ----

// Writes `bytes` to `path` through a temp file, fsynced, renamed into place.
void write_atomic(const fs::path& path, std::string_view bytes, bool faultable);
// Removes what interrupted writes left in `parent` (of the entry `only`, or all).
void clean_leftovers(const fs::path& parent, const std::string& only);
// Whether `p` exists (a dangling link counts; links are not followed).
bool exists_no_follow(const fs::path& p);
// A leftover's name split into its base and its mark; false for other names.
bool split_leftover(const std::string& name, std::string& base, std::string_view& mark);
// The whole checkpoint directory `dir`, built aside and committed.
void write_checkpoint_impl(const std::string& dir_arg, const std::map<std::string, Tensor>& model,
                           const std::map<std::string, Tensor>& optimizer,
                           const std::string& recipe_yaml, const json::Value& card,
                           const json::Value& state);
// "step-00001234" -> 1234; nullopt for anything else.
std::optional<int64_t> parse_name(std::string_view name);
// s without leading and trailing white space.
std::string trim(std::string s);

}  // namespace forge::train::checkpoint_detail
