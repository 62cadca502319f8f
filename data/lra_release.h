// Long Range Arena's data from the public releases, into the layouts the
// readers take (data/listops.h, data/text.h, data/pathfinder.h,
// data/image_folder.h) and the LRA recipes read (recipes/lra/*.yaml):
//
//   task        from (as downloaded and unpacked)              out
//   listops     LRA's listops-1000 folder (lra_release.gz)     basic_{train,val,test}.tsv
//   text        IMDb's aclImdb folder (aclImdb_v1.tar.gz)      {train,test}.tsv: label<TAB>review
//   retrieval   LRA's tsv_data folder (new_aan_pairs.*.tsv)    {train,val,test}.tsv (AAN rows)
//   image       CIFAR-10's cifar-10-batches-bin folder         {train,val,test}/<class>/NNNNN.png
//   pathfinder  one of LRA's pathfinder32/curv_* folders       {train,val,test}/{imgs,metadata}
//
// `from` may also be a folder above the one named (the unpacked archive's
// top): the known sub-paths are searched. Splits follow LRA's input
// pipelines: ListOps and AAN as released (AAN's "eval" is val); IMDb's train
// and test; CIFAR-10's training batches in order, the first 90% train and the
// last 10% val, test_batch test; Pathfinder's metadata lines in order, 80% /
// 10% / 10% (LRA takes these percentages of TFDS's order, which we cannot
// reproduce: the same proportions of the same images, not the same members).
// IMDb reviews hold no line breaks in the release; any found are written as
// spaces and counted in the notes. Pathfinder's images are not copied: each
// split's imgs/ is a symbolic link to the release's (keep it there).
//
// Everything is checked by the reader that will read it, then written to
// `out` through a temporary folder renamed into place: `out` must not exist
// or be an empty folder, and a failure leaves nothing behind.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/names.h"

namespace forge::data {

enum class LraTask { listops, text, retrieval, image, pathfinder };
inline constexpr NameTable<LraTask, 5> kLraTaskNames{
    "LRA task", {"listops", "text", "retrieval", "image", "pathfinder"}};
inline const char* lra_task_name(LraTask task) { return name_of(kLraTaskNames, task); }
// Throws a forge::Error listing the names on an unknown one.
inline LraTask lra_task_from_name(const std::string& name) {
  return enum_from_name(kLraTaskNames, name);
}
// "data/lra/<task>": where the recipes look.
std::string lra_default_dir(LraTask task);

struct PreparedLra {
  std::string from;                                       // the folder read
  std::vector<std::pair<std::string, int64_t>> examples;  // (split, examples) as written
  std::vector<std::string> notes;                         // what the user should know
};

PreparedLra prepare_lra(LraTask task, const std::string& from, const std::string& out);

}  // namespace forge::data
