// Writes the seed corpus of every fuzz target (tests/fuzz/corpus/<target>/),
// the dictionary of recipe keys (dict/recipe.dict, from the schema) and the
// known-bad inputs built here (regressions/<target>/): small valid files of each
// format, made with the project's own writers where it has them, so that they
// stay valid as the formats evolve. Run from the fuzz build:
//   build-fuzz/tests/fuzz/make_fuzz_corpus tests/fuzz
// It overwrites the files it names and leaves any others (e.g. regression
// inputs found by fuzzing) alone.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

// clang-format off
#include <png.h>
#include <zlib.h>
#include <jpeglib.h>  // needs <cstdio> first
// clang-format on

#include "core/error.h"
#include "core/json.h"
#include "core/safetensors.h"
#include "data/image_io.h"
#include "data/listops.h"
#include "train/recipe.h"

namespace {

using namespace forge;
namespace fs = std::filesystem;

using Bytes = std::vector<uint8_t>;

fs::path g_root;

void write(const std::string& dir, const std::string& name, std::string_view bytes) {
  const fs::path d = g_root / dir;
  fs::create_directories(d);
  std::ofstream out(d / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FORGE_CHECK(out.good(), "cannot write {}", (d / name).string());
}

void write(const std::string& dir, const std::string& name, const Bytes& bytes) {
  write(dir, name, std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  FORGE_CHECK(in.good(), "cannot read {}", path.string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

Bytes gzip(const Bytes& data) {
  z_stream z{};
  FORGE_CHECK(
      deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK,
      "deflateInit2 failed");
  Bytes out(deflateBound(&z, data.size()) + 32);
  z.next_in = const_cast<Bytef*>(data.data());
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  FORGE_CHECK(deflate(&z, Z_FINISH) == Z_STREAM_END, "deflate failed");
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// ---- safetensors ----

Tensor filled(const Shape& shape, DType dtype, uint8_t first) {
  Tensor t = Tensor::empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  // BOOL bytes must be 0 or 1; any bytes are some value of the other types.
  for (size_t i = 0; i < t.nbytes(); ++i)
    p[i] = dtype == DType::boolean ? i % 2 : static_cast<uint8_t>(first + i);
  return t;
}

void safetensors_seeds() {
  write("corpus/safetensors", "empty.safetensors", safetensors::serialize({}));
  write("corpus/safetensors", "f32_metadata.safetensors",
        safetensors::serialize({{"weight", filled({2, 3}, DType::f32, 0)}},
                               {{"format", "pt"}, {"step", "12"}}));
  write("corpus/safetensors", "every_dtype.safetensors",
        safetensors::serialize({{"a.f64", filled({}, DType::f64, 1)},
                                {"b.i32", filled({0}, DType::i32, 2)},
                                {"c.i64", filled({2}, DType::i64, 3)},
                                {"d.u8", filled({2, 2}, DType::u8, 4)},
                                {"e.bool", filled({3}, DType::boolean, 0)},
                                {"f.bf16", filled({2}, DType::bf16, 5)},
                                {"g.f16", filled({1, 2}, DType::f16, 6)}}));
  // The header as the Python package writes it: no padding, keys unsorted.
  const std::string header = R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                             R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  std::string file(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header + std::string("\x00\x00\x80\x3f\x00\x00\x00\x40", 8);
  write("corpus/safetensors", "python_layout.safetensors", file);
}

// ---- JSON ----

void json_seeds() {
  write("corpus/json", "scalars.json", R"([null, true, false, 0, -0, 1.5, -2.25e-3, 1E+3, "x"])");
  write("corpus/json", "integers.json",
        R"({"i64_min": -9223372036854775808, "u64_max": 18446744073709551615, "big": 1e308})");
  write("corpus/json", "strings.json",
        R"(["esc \" \\ \/ \b \f \n \r \t", "\u00e9\u4e2d\ud83d\ude00", "é中😀", ""])");
  write("corpus/json", "nested.json",
        "{\n  \"a\": {\"b\": [[], {}, [1, [2, [3]]]]},\n  \"c\": \"d\"\n}\n");
  write(
      "corpus/json", "safetensors_header.json",
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}})");
  write("corpus/json", "state.json",
        json::dump(json::Value(json::Object{
                       {"step", 1200},
                       {"rng", json::Object{{"seed", uint64_t{1} << 63}, {"offset", 42}}},
                       {"lr", 3e-4},
                       {"done", false}}),
                   2));
  write("corpus/json", "deepest.json",
        std::string(json::kMaxDepth, '[') + std::string(json::kMaxDepth, ']'));
}

// ---- recipes ----

void recipe_seeds(const fs::path& repo) {
  for (const char* r : {"vit/fmnist_tiny.yaml", "vit/fmnist_favor.yaml", "lra/listops.yaml",
                        "lra/retrieval.yaml"}) {
    const fs::path p = repo / "recipes" / r;
    write("corpus/recipe", p.parent_path().filename().string() + "_" + p.filename().string(),
          read_text(p));
  }
  // Every key, as --dump-config prints them.
  write("corpus/recipe", "every_key.yaml", train::Recipe().to_yaml());
  write("corpus/recipe", "flow_and_anchors.yaml",
        "name: &n \"quoted: name\"\nmodel: {dim: 32, attention: {kind: linformer}}\n"
        "data: {mean: [0.5], std: [0.25]}\noptimizer:\n  lr: !!float 1e-3\n");

  // --set: each key at its default, one assignment a line, a few files.
  std::string lines;
  int file = 0;
  const auto& schema = train::recipe_schema();
  for (size_t i = 0; i < schema.size(); ++i) {
    lines += schema[i].path + "=" + json::dump(schema[i].default_value) + "\n";
    if ((i + 1) % 24 == 0 || i + 1 == schema.size()) {
      write("corpus/recipe_set", fmt::format("defaults_{}.txt", file++), lines);
      lines.clear();
    }
  }
  write("corpus/recipe_set", "typical.txt",
        "optimizer.lr=3e-4\nmodel.attention.kind=favor\nloop.batch_size=64\n"
        "name=a run with spaces\ndata.mean=[0.5, 0.5, 0.5]\nmodel.attention.per_layer=[softmax, "
        "local]\n");

  // The dictionary: every key and section name and every choice.
  std::set<std::string> words;
  for (const train::KeySpec& k : schema) {
    size_t start = 0;
    for (size_t dot = k.path.find('.');; dot = k.path.find('.', start)) {
      words.insert(
          k.path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    words.insert(k.path);
    for (const std::string& c : k.choices) words.insert(c);
  }
  std::string dict =
      "# Recipe keys, sections and choices (make_fuzz_corpus, from recipe_schema()).\n";
  for (const std::string& w : words) dict += fmt::format("\"{}\"\n", w);
  dict +=
      "\": \"\n\"=\"\n\"[\"\n\"]\"\n\"{\"\n\"}\"\n\"- \"\n\"&a \"\n\"*a\"\n\"!!str \"\n\"~\"\n"
      "\"true\"\n\"null\"\n\".inf\"\n\"1e-3\"\n";
  write("dict", "recipe.dict", dict);
}

// ---- IDX ----

Bytes idx(const std::vector<uint32_t>& dims, size_t data_bytes) {
  Bytes b = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
  }
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<uint8_t>(i * 37));
  return b;
}

void idx_seeds() {
  write("corpus/idx", "labels.idx", idx({5}, 5));
  write("corpus/idx", "images.idx", idx({2, 3, 3}, 18));
  write("corpus/idx", "empty.idx", idx({0}, 0));
  write("corpus/idx", "labels.idx.gz", gzip(idx({5}, 5)));
  write("corpus/idx", "images.idx.gz", gzip(idx({2, 3, 3}, 18)));

  // Bombs: a few header bytes that declare huge arrays. Fixed, each must be a
  // clean error, quickly and without allocating what the header declares.
  write("regressions/idx", "labels_4g_items.idx", Bytes{0, 0, 0x08, 0x01, 0xff, 0xff, 0xff, 0xff});
  write("regressions/idx", "two_dims_1tib.idx", idx({1u << 20, 1u << 20}, 0));
  // 2^20 * 2^20 * 2^24 = 2^64 elements: wraps a 64-bit count to 0.
  write("regressions/idx", "three_dims_2pow64.idx", idx({1u << 20, 1u << 20, 1u << 24}, 0));
}

// ---- ListOps and text TSVs ----

void tsv_seeds() {
  write("corpus/listops", "lra_rows.tsv",
        "Source\tTarget\r\n( ( ( [MAX 2 ) 9 ) ] )\t9\r\n"
        "( ( ( [SM ( ( ( [MIN 4 ) 7 ) ] ) ) 8 ) ] )\t2\r\n\r\n5\t5\n");
  write("corpus/listops", "med.tsv", "Source\tTarget\n( ( ( ( [MED 1 ) 5 ) 2 ) ] )\t2\n");
  write("corpus/listops", "header_only.tsv", "Source\tTarget\n");
  data::ListOpsGenConfig c{.max_depth = 4,
                           .max_args = 4,
                           .min_length = 3,
                           .max_length = 60,
                           .num_train = 6,
                           .num_val = 0,
                           .num_test = 0};
  const data::ListOpsSplits s = data::generate_listops(c, 1);
  const fs::path generated = g_root / "corpus/listops/generated.tsv";
  data::write_listops_tsv(generated.string(), s.train);

  write("corpus/text", "labels.tsv",
        "1\tgreat film\r\n0\tdull\tand long\n\n2.0\t\xC3\xA9t\xC3\xA9\n");
  write("corpus/text", "long_line.tsv", "3\t" + std::string(300, 'a') + "\n0\t\n");
  write("corpus/retrieval", "three_fields.tsv", "1\tfirst doc\tsecond doc\n0\tx\ty\n");
  write("corpus/retrieval", "aan_rows.tsv",
        "0.0\tid-a\tid-b\tleft text\tright text\r\n1.0\tp1\tp2\t\xC3\xA9\tb\n");
}

// ---- images ----

data::Image gradient(int64_t h, int64_t w, int64_t c) {
  data::Image im{h, w, c, {}};
  for (int64_t i = 0; i < h * w * c; ++i) im.pixels.push_back(static_cast<uint8_t>(i * 29));
  return im;
}

// A PNG of `color_type` / `bit_depth` written with libpng directly (our
// encoder only writes 8-bit gray and RGB), pixels from a counter.
Bytes png_with(int color_type, int bit_depth, bool interlaced, bool transparency) {
  Bytes out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_set_write_fn(
      png, &out,
      [](png_structp p, png_bytep data, size_t n) {
        auto* o = static_cast<Bytes*>(png_get_io_ptr(p));
        o->insert(o->end(), data, data + n);
      },
      nullptr);
  const png_uint_32 w = 5, h = 4;
  png_set_IHDR(png, info, w, h, bit_depth, color_type,
               interlaced ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  png_color palette[4] = {{0, 0, 0}, {255, 0, 0}, {0, 255, 0}, {0, 0, 255}};
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_PLTE(png, info, palette, 4);
  png_byte alpha[2] = {0, 128};
  png_color_16 gray_key{};
  if (transparency) png_set_tRNS(png, info, alpha, 2, &gray_key);
  png_set_gAMA(png, info, 0.45455);
  png_write_info(png, info);
  int channels = color_type == PNG_COLOR_TYPE_RGB_ALPHA    ? 4
                 : color_type == PNG_COLOR_TYPE_RGB        ? 3
                 : color_type == PNG_COLOR_TYPE_GRAY_ALPHA ? 2
                                                           : 1;
  const size_t row_bytes = (w * static_cast<size_t>(channels * bit_depth) + 7) / 8;
  std::vector<Bytes> rows(h, Bytes(row_bytes));
  std::vector<png_bytep> pointers;
  for (size_t y = 0; y < h; ++y) {
    for (size_t x = 0; x < row_bytes; ++x) rows[y][x] = static_cast<uint8_t>(y * 41 + x * 13);
    pointers.push_back(rows[y].data());
  }
  png_write_image(png, pointers.data());
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return out;
}

Bytes progressive_jpeg() {
  const data::Image im = gradient(16, 16, 3);
  jpeg_compress_struct c{};
  jpeg_error_mgr err{};
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* mem = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &mem, &size);
  c.image_width = 16;
  c.image_height = 16;
  c.input_components = 3;
  c.in_color_space = JCS_RGB;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, 80, TRUE);
  jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(im.pixels.data()) + c.next_scanline * 16 * 3;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  Bytes out(mem, mem + size);
  std::free(mem);
  return out;
}

// A PNG chunk: length, type, data, CRC of type and data.
void png_chunk(Bytes& out, const char* type, const Bytes& data) {
  const auto n = static_cast<uint32_t>(data.size());
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(n >> s));
  Bytes body(type, type + 4);
  body.insert(body.end(), data.begin(), data.end());
  out.insert(out.end(), body.begin(), body.end());
  const auto crc = static_cast<uint32_t>(crc32(0, body.data(), static_cast<uInt>(body.size())));
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<uint8_t>(crc >> s));
}

void image_seeds() {
  write("corpus/image", "gray_4x3.png", data::encode_png(gradient(3, 4, 1)));
  write("corpus/image", "rgb_3x2.png", data::encode_png(gradient(2, 3, 3)));
  write("corpus/image", "palette_2bit_trns.png", png_with(PNG_COLOR_TYPE_PALETTE, 2, false, true));
  write("corpus/image", "gray_alpha_16bit_adam7.png",
        png_with(PNG_COLOR_TYPE_GRAY_ALPHA, 16, true, false));
  write("corpus/image", "gray_1bit.png", png_with(PNG_COLOR_TYPE_GRAY, 1, false, false));
  write("corpus/image", "gray_8x8.jpg", data::encode_jpeg(gradient(8, 8, 1), 90));
  write("corpus/image", "rgb_16x8.jpg", data::encode_jpeg(gradient(8, 16, 3), 75));
  write("corpus/image", "rgb_16x16_progressive.jpg", progressive_jpeg());

  // A 74-byte PNG whose IHDR declares 37000 x 37000 RGB (4.1 GB decoded), with
  // valid CRCs, and an IDAT holding the start of a zlib stream; no IEND.
  Bytes png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  png_chunk(png, "IHDR", {0, 0, 0x90, 0x88, 0, 0, 0x90, 0x88, 8, 2, 0, 0, 0});
  Bytes idat = {0x78, 0x9c};
  for (int i = 0; idat.size() < 29; ++i) idat.push_back(static_cast<uint8_t>(0x63 + i));
  png_chunk(png, "IDAT", idat);
  write("regressions/image", "png_37000x37000_truncated_idat.png", png);

  // A 56-byte JPEG: SOI, a progressive SOF2 declaring 65000 x 65000 gray, one
  // Huffman table, the start of a DC scan and a few bytes of it.
  const Bytes jpeg = {
      0xff, 0xd8,  // SOI
      0xff, 0xc2, 0x00, 0x0b, 0x08, 0xfd, 0xe8, 0xfd, 0xe8,
      0x01,                                                  // SOF2: 8 bit, 65000 x 65000, 1 comp
      0x01, 0x11, 0x00,                                      //   id 1, 1x1 sampling, table 0
      0xff, 0xc4, 0x00, 0x14, 0x00,                          // DHT: DC table 0
      0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,        //   one code of length 1
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  //   ... for the symbol 0
      0xff, 0xda, 0x00, 0x08, 0x01, 0x01, 0x00, 0x00, 0x00,
      0x00,                                                  // SOS: comp 1, DC first scan
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // scan data, cut short
  };
  write("regressions/image", "jpeg_65000x65000_progressive.jpg", jpeg);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <tests/fuzz directory>\n", argv[0]);
    return 2;
  }
  try {
    g_root = fs::path(argv[1]);
    FORGE_CHECK(fs::exists(g_root / "fuzz_util.h"), "{} is not tests/fuzz (no fuzz_util.h)",
                g_root.string());
    safetensors_seeds();
    json_seeds();
    recipe_seeds(fs::absolute(g_root) / ".." / "..");
    idx_seeds();
    tsv_seeds();
    image_seeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "make_fuzz_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
