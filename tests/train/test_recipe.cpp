// Recipes: defaults, overrides, the resolved YAML, and one clear error per
// kind of mistake (unknown key, wrong type, out of range, bad choice, ...).
#include <gtest/gtest.h>

#include "core/error.h"
#include "tests/test_util.h"
#include "train/data.h"
#include "train/recipe.h"

namespace forge::train {
namespace {

// The error a recipe text gives (fails the test, naming the text, when it gives none).
std::string yaml_error(const std::string& text) {
  SCOPED_TRACE("no error for:\n" + text);
  return testing::error_of([&] { Recipe::from_yaml(text, "bad.yaml"); });
}

// The error a --set assignment gives (fails the test, naming it, when it gives none).
std::string set_error(const std::string& assignment) {
  SCOPED_TRACE("no error for --set " + assignment);
  Recipe r;
  return testing::error_of([&] { r.set(assignment); });
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

TEST(Recipe, DefaultsComeFromTheSchema) {
  Recipe r;
  EXPECT_EQ(r.string("model.type"), "vit");
  EXPECT_EQ(r.integer("loop.batch_size"), 128);
  EXPECT_EQ(r.string("model.attention.kind"), "softmax");
  EXPECT_FALSE(r.is_set("loop.batch_size"));
  EXPECT_TRUE(r.int_list("model.axial_shape").empty());
}

TEST(Recipe, ReadsEveryKindOfValue) {
  const Recipe r = Recipe::from_yaml(R"(
name: tiny
seed: 7
model:
  dim: 64
  qkv_bias: false
  attention:
    kind: favor
    per_layer: [softmax, favor]
    per_layer_local_heads: [1, 0]
  axial_shape: [8, 8]
data:
  mean: [0.5]
  root: /tmp/x
optimizer:
  lr: 3e-4
)",
                                     "tiny.yaml");
  EXPECT_EQ(r.string("name"), "tiny");
  EXPECT_EQ(r.integer("seed"), 7);
  EXPECT_EQ(r.integer("model.dim"), 64);
  EXPECT_FALSE(r.boolean("model.qkv_bias"));
  EXPECT_EQ(r.string("model.attention.kind"), "favor");
  EXPECT_EQ(r.string_list("model.attention.per_layer"),
            (std::vector<std::string>{"softmax", "favor"}));
  EXPECT_EQ(r.int_list("model.attention.per_layer_local_heads"), (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(r.int_list("model.axial_shape"), (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(r.number_list("data.mean"), (std::vector<double>{0.5}));
  EXPECT_EQ(r.string("data.root"), "/tmp/x");
  EXPECT_DOUBLE_EQ(r.number("optimizer.lr"), 3e-4);
  EXPECT_TRUE(r.is_set("optimizer.lr"));
  EXPECT_FALSE(r.is_set("optimizer.beta1"));
}

TEST(Recipe, SetOverridesScalarsAndLists) {
  Recipe r = Recipe::from_yaml("model: {dim: 64}\n", "r.yaml");
  r.set("model.dim=128");
  r.set("model.attention.kind=linformer");
  r.set("model.attention.per_layer=[local, softmax]");
  r.set("optimizer.lr=0.05");
  r.set("data.root=/data/with spaces");
  r.set("model.reversible=true");
  EXPECT_EQ(r.integer("model.dim"), 128);
  EXPECT_EQ(r.string("model.attention.kind"), "linformer");
  EXPECT_EQ(r.string_list("model.attention.per_layer"),
            (std::vector<std::string>{"local", "softmax"}));
  EXPECT_DOUBLE_EQ(r.number("optimizer.lr"), 0.05);
  EXPECT_EQ(r.string("data.root"), "/data/with spaces");
  EXPECT_TRUE(r.boolean("model.reversible"));
}

TEST(Recipe, ResolvedYamlReadsBackToTheSameRecipe) {
  Recipe r = Recipe::from_yaml("name: a\nmodel: {dim: 96, attention: {kind: local, ts_a: 0.25}}\n",
                               "r.yaml");
  r.set("optimizer.lr=1e-5");
  r.set("data.std=[0.25, 0.5]");
  r.set("data.root=yes");  // a string key keeps the word, not a boolean
  const std::string yaml = r.to_yaml();
  const Recipe back = Recipe::from_yaml(yaml, "resolved.yaml");
  for (const KeySpec& k : recipe_schema())
    EXPECT_TRUE(back.value(k.path) == r.value(k.path)) << k.path << "\n" << yaml;
  EXPECT_EQ(back.to_yaml(), yaml);
  EXPECT_EQ(back.string("data.root"), "yes");
}

// An empty file (or one holding only comments) would silently train the
// default model on the default data.
TEST(RecipeErrors, EmptyRecipeIsRefused) {
  for (const char* text : {"", "\n\n", "# nothing yet\n", "~\n"}) {
    SCOPED_TRACE(text);
    forge::testing::expect_error([&] { Recipe::from_yaml(text, "empty.yaml"); },
                                 {"empty.yaml", "empty"});
  }
}

// A second YAML document would be ignored: refused, naming its line. One
// document that starts with '---' is a recipe like any.
TEST(RecipeErrors, ASecondYamlDocumentIsRefused) {
  forge::testing::expect_error(
      [] { Recipe::from_yaml("model: {dim: 8}\n---\nmodel: {dim: 16}\n", "two.yaml"); },
      {"two.yaml:3", "second YAML document", "one document"});
  EXPECT_EQ(Recipe::from_yaml("---\nmodel: {dim: 8}\n", "one.yaml").integer("model.dim"), 8);
}

// Found by fuzzing: YAML's printer rewrote invalid UTF-8 (an overlong NUL
// became a real one), so the recipe a run kept was not the one it ran.
TEST(RecipeErrors, InvalidUtf8AndControlCharactersAreRefused) {
  for (const std::string& bad :
       {std::string("name: a\xC0\x80\n"), std::string("name: \xFF\xFE\n"),
        std::string("name: \"a\\x01b\"\n"), std::string("data: {root: \"/d\\0\"}\n"),
        std::string("name: \xED\xA0\x80\n")}) {
    SCOPED_TRACE(bad);
    EXPECT_HAS(yaml_error(bad), "invalid UTF-8 or a control character");
  }
  EXPECT_HAS(set_error(std::string("name=x\x1b[31m")), "invalid UTF-8 or a control character");
  // Well-formed text in any script stays, and reads back the same.
  const Recipe r = Recipe::from_yaml("name: vit-\xC3\xBC\xE2\x82\xAC\n", "utf8.yaml");
  EXPECT_EQ(r.string("name"), "vit-\xC3\xBC\xE2\x82\xAC");
  EXPECT_EQ(Recipe::from_yaml(r.to_yaml(), "back.yaml").string("name"), r.string("name"));
}

TEST(RecipeErrors, ADirectoryIsNotARecipe) {
  const forge::testing::TempDir tmp;
  forge::testing::expect_error([&] { Recipe::from_file(tmp.path().string()); },
                               {tmp.path().string(), "is a directory", "--resume"});
}

// The run directory is runs/<name> or output.dir: a recipe cannot point it
// outside the working directory.
TEST(RecipeErrors, NameAndOutputDirCannotEscape) {
  for (const char* bad : {"name: ../../escape\n", "name: a/b\n", "name: ..\n", "name: .\n",
                          "name: ''\n", "output: {dir: /tmp/elsewhere}\n",
                          "output: {dir: runs/../../x}\n", "output: {dir: ..}\n"}) {
    SCOPED_TRACE(bad);
    const std::string e = yaml_error(bad);
    EXPECT_TRUE(e.find("'name'") != std::string::npos ||
                e.find("'output.dir'") != std::string::npos)
        << e;
  }
  Recipe r;
  forge::testing::expect_error([&] { r.set("name=../up"); }, {"--set name=../up", "'name'"});
  forge::testing::expect_error([&] { r.set("output.dir=/abs"); }, {"output.dir", "--out"});
  // Plain relative places stay allowed.
  r.set("name=vit-s16_run.2");
  r.set("output.dir=experiments/a/b");
  EXPECT_EQ(r.string("output.dir"), "experiments/a/b");
}

// ---- malformed recipes: each error names the key (and the place) ----

TEST(RecipeErrors, UnknownTopLevelKeyListsTheValidOnes) {
  const std::string e = yaml_error("modle:\n  dim: 3\n");
  EXPECT_HAS(e, "unknown key 'modle'");
  EXPECT_HAS(e, "bad.yaml:1:1");
  EXPECT_HAS(e, "model");
  EXPECT_HAS(e, "optimizer");
}

TEST(RecipeErrors, UnknownNestedKeyNamesItsFullPathAndLine) {
  const std::string e = yaml_error("model:\n  dim: 64\n  attention:\n    knd: favor\n");
  EXPECT_HAS(e, "unknown key 'model.attention.knd'");
  EXPECT_HAS(e, "bad.yaml:4:5");
  EXPECT_HAS(e, "under 'model.attention'");
  EXPECT_HAS(e, "kind");
}

TEST(RecipeErrors, IntegerGivenText) {
  const std::string e = yaml_error("model:\n  depth: four\n");
  EXPECT_HAS(e, "'model.depth' expects an integer, found 'four'");
  EXPECT_HAS(e, "bad.yaml:2:");
}

TEST(RecipeErrors, IntegerGivenAFraction) {
  EXPECT_HAS(yaml_error("loop:\n  batch_size: 12.5\n"),
             "'loop.batch_size' expects an integer, found '12.5'");
}

TEST(RecipeErrors, NumberGivenText) {
  EXPECT_HAS(yaml_error("optimizer:\n  lr: fast\n"),
             "'optimizer.lr' expects a finite number, found 'fast'");
}

TEST(RecipeErrors, NumberGivenInfinity) {
  EXPECT_HAS(yaml_error("optimizer:\n  lr: .inf\n"), "'optimizer.lr' expects a finite number");
}

TEST(RecipeErrors, BooleanGivenText) {
  EXPECT_HAS(yaml_error("model:\n  reversible: maybe\n"),
             "'model.reversible' expects true or false, found 'maybe'");
}

TEST(RecipeErrors, ChoiceNotAmongTheValidOnes) {
  const std::string e = yaml_error("model:\n  attention:\n    kind: flash\n");
  EXPECT_HAS(e, "'model.attention.kind' = 'flash' is not one of");
  EXPECT_HAS(e, "taylorshift");
}

TEST(RecipeErrors, NegativeDepthIsOutOfRange) {
  EXPECT_HAS(yaml_error("model:\n  depth: -2\n"), "'model.depth' = -2 is out of range [1, 1024]");
}

TEST(RecipeErrors, DropoutAboveOneIsOutOfRange) {
  EXPECT_HAS(yaml_error("model:\n  dropout: 1.5\n"), "'model.dropout' = 1.5 is out of range");
}

TEST(RecipeErrors, ZeroBatchSizeIsOutOfRange) {
  EXPECT_HAS(yaml_error("loop:\n  batch_size: 0\n"), "'loop.batch_size' = 0 is out of range");
}

TEST(RecipeErrors, KeyWithoutValue) {
  EXPECT_HAS(yaml_error("optimizer:\n  lr:\n"), "'optimizer.lr' has no value");
}

TEST(RecipeErrors, ScalarWhereASectionBelongs) {
  const std::string e = yaml_error("model: vit\n");
  EXPECT_HAS(e, "'model' must be a mapping");
}

TEST(RecipeErrors, SectionWhereAScalarBelongs) {
  EXPECT_HAS(yaml_error("seed:\n  value: 3\n"), "'seed' expects an integer");
}

TEST(RecipeErrors, ListWhereAScalarBelongs) {
  EXPECT_HAS(yaml_error("model:\n  dim: [1, 2]\n"),
             "'model.dim' expects an integer, found '[1, 2]'");
}

TEST(RecipeErrors, ScalarWhereAListBelongs) {
  EXPECT_HAS(
      yaml_error("model:\n  attention:\n    per_layer: softmax\n"),
      "'model.attention.per_layer' expects a list of strings such as [a, b], found 'softmax'");
}

TEST(RecipeErrors, BadElementInAList) {
  EXPECT_HAS(yaml_error("model:\n  attention:\n    per_layer: [softmax, sofmax]\n"),
             "'model.attention.per_layer' = 'sofmax' is not one of");
  EXPECT_HAS(yaml_error("data:\n  mean: [0.5, x]\n"),
             "'data.mean' expects a finite number, found 'x'");
}

TEST(RecipeErrors, NotYaml) {
  const std::string e = yaml_error("model:\n  dim: [1, 2\n");
  EXPECT_HAS(e, "bad.yaml");
  EXPECT_HAS(e, "not valid YAML");
}

TEST(RecipeErrors, TopLevelIsNotAMapping) {
  EXPECT_HAS(yaml_error("- a\n- b\n"), "the recipe must be a mapping");
}

TEST(RecipeErrors, MissingFile) {
  try {
    Recipe::from_file("/nonexistent/recipe.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_HAS(e.what(), "/nonexistent/recipe.yaml");
  }
}

TEST(RecipeErrors, SetErrorsNameTheKey) {
  EXPECT_HAS(set_error("model.dimm=3"), "unknown key 'model.dimm'");
  EXPECT_HAS(set_error("model.dimm=3"), "under 'model'");
  EXPECT_HAS(set_error("model.attention.kindd=x"), "under 'model.attention'");
  EXPECT_HAS(set_error("optimizer.lr"), "expected key=value");
  EXPECT_HAS(set_error("optimizer.lr=abc"), "'optimizer.lr' expects a finite number, found 'abc'");
  EXPECT_HAS(set_error("loop.steps=-1"), "'loop.steps' = -1 is out of range");
  EXPECT_HAS(set_error("nope=1"), "Valid keys at the top level");
}

TEST(RecipeReference, ListsEveryKey) {
  const std::string md = recipe_reference_markdown();
  for (const KeySpec& k : recipe_schema()) EXPECT_HAS(md, "`" + k.path + "`");
}

}  // namespace
}  // namespace forge::train

#include <filesystem>
#include <fstream>
#include <sstream>

#include "train/model.h"

namespace forge::train {
namespace {

namespace fs = std::filesystem;

TEST(RecipeReference, DocsRecipesMdIsTheGeneratedReference) {
  std::ifstream in(fs::path(FORGE_SOURCE_DIR) / "docs" / "RECIPES.md");
  ASSERT_TRUE(in.good()) << "docs/RECIPES.md is missing";
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), recipe_reference_markdown())
      << "regenerate it: build/apps/attnforge recipe-reference > docs/RECIPES.md";
}

// Every shipped recipe reads, and builds its model for data of the shape it expects.
TEST(ShippedRecipes, EveryRecipeReadsAndBuildsItsModel) {
  int count = 0;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(FORGE_SOURCE_DIR) / "recipes")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    const Recipe r = Recipe::from_file(e.path().string());
    DataShape shape;
    const std::string& kind = r.string("data.dataset");
    if (kind == "lm_text" || kind == "copy" || kind == "seq2seq_tsv") {
      shape = next_token_shape(r);
    } else if (kind == "fashion_mnist" || kind == "image_folder") {
      shape.images = true;
      shape.classes = kind == "fashion_mnist" ? 10 : 1000;
      shape.channels = kind == "fashion_mnist" ? 1 : 3;
      shape.image_size = r.integer("model.image_size");
    } else {
      shape.images = false;
      shape.classes = kind == "listops" ? 10 : 2;
      shape.vocab_size = kind == "listops" ? 16 : kind == "text" || kind == "retrieval" ? 257 : 256;
      shape.max_length = r.integer("data.max_length") > 0 ? r.integer("data.max_length")
                         : kind == "pathfinder"           ? 1024
                                                          : 784;
      shape.pairs = kind == "retrieval";
    }
    Generator gen(0);
    std::unique_ptr<TaskModel> task;
    EXPECT_NO_THROW(task = build_model(r, shape, DType::f32, &gen));
    // The bound that refuses models no machine holds is a bound, and a close one.
    int64_t params = 0;
    if (task)
      for (const auto& [name, t] : task->module().named_parameters()) params += t.numel();
    const double bound = parameter_lower_bound(r, shape);
    EXPECT_LE(bound, static_cast<double>(params));
    EXPECT_GE(bound, 0.7 * static_cast<double>(params));
    ++count;
  }
  EXPECT_GE(count, 17);
}

}  // namespace
}  // namespace forge::train
