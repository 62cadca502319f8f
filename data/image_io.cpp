// PNG (libpng) and JPEG (libjpeg) decoding and encoding.
//
// Both libraries report errors by calling a handler that must not return; ours
// copy the message into a fixed buffer and longjmp. Every setjmp sits in a
// small function whose frame holds only pointers and scalars, and the jumps
// come from libpng/libjpeg's own C frames, so no C++ destructor is ever
// skipped. The C++ callers own the buffers and the library handles (released
// by destructors) and throw forge::Error when such a function returns false.
#include "data/image_io.h"

#include <algorithm>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>

// clang-format off
#include <png.h>
#include <jpeglib.h>  // needs <cstdio> first
#include <jerror.h>   // needs jpeglib.h first
// clang-format on

#include "core/error.h"

namespace forge::data {

namespace {

constexpr size_t kMessageSize = 512;

constexpr png_alloc_size_t kPngChunkMaxBytes = 8'000'000;  // libpng's default

const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

bool has_png_signature(const std::vector<uint8_t>& b) {
  return b.size() >= 8 && std::memcmp(b.data(), kPngSignature, 8) == 0;
}

bool has_jpeg_signature(const std::vector<uint8_t>& b) {
  return b.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff;
}

std::string leading_bytes(const std::vector<uint8_t>& b) {
  std::string s;
  for (size_t i = 0; i < b.size() && i < 8; ++i) s += fmt::format("{}{:02X}", i ? " " : "", b[i]);
  return s;
}

void check_encodable(const Image& image, const char* format, int64_t max_side) {
  FORGE_CHECK(image.channels == 1 || image.channels == 3,
              "{} encoder: expected 1 (gray) or 3 (RGB) channels, got {}", format, image.channels);
  FORGE_CHECK(
      image.height > 0 && image.width > 0 && image.height <= max_side && image.width <= max_side,
      "{} encoder: image size {}x{} is outside 1..{}", format, image.height, image.width, max_side);
  FORGE_CHECK(
      static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
      "{} encoder: {}x{}x{} image needs {} pixel bytes, has {}", format, image.height, image.width,
      image.channels, image.height * image.width * image.channels, image.pixels.size());
}

// Called right after a header is read, before anything of the image's size is
// allocated: a few bytes of header can declare gigapixels.
void check_pixel_budget(const std::string& what, const char* format, int64_t width, int64_t height,
                        int64_t max_pixels) {
  FORGE_CHECK(width * height <= max_pixels,
              "{}: the {} header declares {}x{} pixels (width x height, {} in all), more than the "
              "limit of {} pixels per image; if the image is genuine, raise the limit (recipe key "
              "data.max_image_pixels), else the file is damaged",
              what, format, width, height, width * height, max_pixels);
}

void check_decode_arguments(const std::string& what, int64_t max_pixels, int scale_denom) {
  FORGE_CHECK(max_pixels >= 1, "{}: the pixel limit must be at least 1, got {}", what, max_pixels);
  FORGE_CHECK(scale_denom == 1 || scale_denom == 2 || scale_denom == 4 || scale_denom == 8,
              "{}: the JPEG scale denominator must be 1, 2, 4 or 8 (libjpeg's scaled IDCT), got {}",
              what, scale_denom);
}

[[noreturn]] void fail_not_an_image(const std::vector<uint8_t>& bytes, const std::string& what) {
  FORGE_CHECK(!bytes.empty(), "{}: not a PNG or JPEG image (the file is empty)", what);
  FORGE_FAIL(
      "{}: not a PNG or JPEG image (expected the PNG signature 89 50 4E 47 0D 0A 1A 0A or the "
      "JPEG marker FF D8 FF, found {})",
      what, leading_bytes(bytes));
}

// What a decoder learned from the header: the output layout.
struct DecodedHeader {
  int64_t height = 0, width = 0, channels = 0;
  size_t row_bytes = 0;
};

// ---------------------------------------------------------------- PNG ----

struct PngState {
  png_structp png = nullptr;
  png_infop info = nullptr;
  // Reading: the encoded bytes and the read position.
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  // Writing: the encoded bytes so far (owned by the C++ caller's object).
  std::vector<uint8_t>* out = nullptr;
  bool out_of_memory = false;
  char message[kMessageSize] = {};
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof s->message, "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}  // benign: CRC of an ancillary chunk, ...

void read_png_bytes(png_structp png, png_bytep dst, size_t n) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) {
    char message[kMessageSize];
    std::snprintf(message, sizeof message,
                  "truncated file (needed %zu more bytes at offset %zu, the data has %zu)", n,
                  s->pos, s->size);
    png_error(png, message);
  }
  std::memcpy(dst, s->data + s->pos, n);
  s->pos += n;
}

void write_png_bytes(png_structp png, png_bytep src, size_t n) {
  auto* s = static_cast<PngState*>(png_get_io_ptr(png));
  try {
    s->out->insert(s->out->end(), src, src + n);
  } catch (const std::bad_alloc&) {
    s->out_of_memory = true;
  }
  if (s->out_of_memory) png_error(png, "out of memory while encoding");
}

void flush_png_bytes(png_structp) {}

// Reads the chunks up to the image data (IHDR first). Returns false (message
// in s->message) when libpng reports an error.
bool read_png_info(PngState* s) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_read_info(s->png, s->info);
  return true;
}

// Sets the conversions to 8-bit gray or RGB (this allocates libpng's row
// buffers) and reports the output layout. Returns false as above.
bool read_png_layout(PngState* s, DecodedHeader* h) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_set_scale_16(s->png);
  png_set_palette_to_rgb(s->png);
  png_set_expand_gray_1_2_4_to_8(s->png);
  png_set_strip_alpha(s->png);
  png_set_interlace_handling(s->png);
  png_read_update_info(s->png, s->info);
  h->height = png_get_image_height(s->png, s->info);
  h->width = png_get_image_width(s->png, s->info);
  h->channels = png_get_channels(s->png, s->info);
  h->row_bytes = png_get_rowbytes(s->png, s->info);
  return true;
}

bool read_png_pixels(PngState* s, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_read_image(s->png, rows);
  png_read_end(s->png, nullptr);
  return true;
}

bool encode_png_rows(PngState* s, const Image* image, png_bytepp rows) {
  if (setjmp(png_jmpbuf(s->png))) return false;
  png_set_write_fn(s->png, s, write_png_bytes, flush_png_bytes);
  png_set_IHDR(s->png, s->info, static_cast<png_uint_32>(image->width),
               static_cast<png_uint_32>(image->height), 8,
               image->channels == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(s->png, s->info);
  png_write_image(s->png, rows);
  png_write_end(s->png, nullptr);
  return true;
}

class PngReader {
 public:
  PngReader(const std::vector<uint8_t>& bytes, const std::string& what) {
    state_.data = bytes.data();
    state_.size = bytes.size();
    state_.png =
        png_create_read_struct(PNG_LIBPNG_VER_STRING, &state_, on_png_error, on_png_warning);
    FORGE_CHECK(state_.png != nullptr, "{}: cannot create a PNG decoder (out of memory)", what);
    state_.info = png_create_info_struct(state_.png);
    FORGE_CHECK(state_.info != nullptr, "{}: cannot create a PNG decoder (out of memory)", what);
    png_set_read_fn(state_.png, &state_, read_png_bytes);
    // libpng's own allocations, whatever limits its build chose: sides (so row
    // buffers) and each ancillary chunk (iCCP, zTXt, ... after decompression).
    png_set_user_limits(state_.png, PNG_USER_WIDTH_MAX, PNG_USER_HEIGHT_MAX);
    png_set_chunk_malloc_max(state_.png, kPngChunkMaxBytes);
  }
  ~PngReader() { png_destroy_read_struct(&state_.png, &state_.info, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  PngState* state() { return &state_; }

 private:
  PngState state_;
};

class PngWriter {
 public:
  explicit PngWriter(std::vector<uint8_t>* out) {
    state_.out = out;
    state_.png =
        png_create_write_struct(PNG_LIBPNG_VER_STRING, &state_, on_png_error, on_png_warning);
    FORGE_CHECK(state_.png != nullptr, "PNG encoder: cannot create it (out of memory)");
    state_.info = png_create_info_struct(state_.png);
    FORGE_CHECK(state_.info != nullptr, "PNG encoder: cannot create it (out of memory)");
  }
  ~PngWriter() { png_destroy_write_struct(&state_.png, &state_.info); }
  PngWriter(const PngWriter&) = delete;
  PngWriter& operator=(const PngWriter&) = delete;

  PngState* state() { return &state_; }

 private:
  PngState state_;
};

std::vector<png_bytep> row_pointers(uint8_t* base, int64_t height, size_t row_bytes) {
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (size_t y = 0; y < rows.size(); ++y) rows[y] = base + y * row_bytes;
  return rows;
}

Image decode_png(const std::vector<uint8_t>& bytes, const std::string& what, int64_t max_pixels) {
  PngReader reader(bytes, what);
  PngState* s = reader.state();
  if (!read_png_info(s)) FORGE_FAIL("{}: invalid PNG: {}", what, s->message);
  check_pixel_budget(what, "PNG", png_get_image_width(s->png, s->info),
                     png_get_image_height(s->png, s->info), max_pixels);
  DecodedHeader h;
  if (!read_png_layout(s, &h)) FORGE_FAIL("{}: invalid PNG: {}", what, s->message);
  FORGE_CHECK(h.channels == 1 || h.channels == 3,
              "{}: PNG decodes to {} channels after conversion, expected 1 or 3", what, h.channels);
  Image image{h.height, h.width, h.channels, {}};
  image.pixels.resize(static_cast<size_t>(h.height) * h.row_bytes);
  std::vector<png_bytep> rows = row_pointers(image.pixels.data(), h.height, h.row_bytes);
  if (!read_png_pixels(reader.state(), rows.data()))
    FORGE_FAIL("{}: invalid PNG: {}", what, reader.state()->message);
  return image;
}

// --------------------------------------------------------------- JPEG ----

struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[kMessageSize];
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* e = static_cast<JpegError*>(cinfo->client_data);
  char text[JMSG_LENGTH_MAX];
  (*cinfo->err->format_message)(cinfo, text);
  std::snprintf(e->message, sizeof e->message, "%s", text);
  std::longjmp(e->jump, 1);
}

// Level -1 is a warning about corrupt data. libjpeg pads data that ends early
// with an end-of-image marker and only warns; that is a truncated file, an
// error here. Other warnings (e.g. extraneous bytes before a marker, common in
// real photo collections) are tolerated, as other decoders do.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    auto* e = static_cast<JpegError*>(cinfo->client_data);
    std::snprintf(e->message, sizeof e->message, "truncated file (the data ends early)");
    std::longjmp(e->jump, 1);
  }
  if (level == -1) cinfo->err->num_warnings++;
}

void no_jpeg_output(j_common_ptr) {}

void init_jpeg_error(JpegError* e) {
  jpeg_std_error(&e->mgr);
  e->mgr.error_exit = on_jpeg_error;
  e->mgr.emit_message = on_jpeg_message;
  e->mgr.output_message = no_jpeg_output;
  e->message[0] = '\0';
}

struct JpegReadState {
  jpeg_decompress_struct cinfo;
  JpegError error;
};

// Reads the header and sets the output to 8-bit gray or RGB at 1/scale_denom
// of the file's size. Returns false (message in s->error.message) on a
// libjpeg error or a CMYK image.
bool read_jpeg_header(JpegReadState* s, const uint8_t* data, size_t size, long max_memory,
                      int scale_denom, DecodedHeader* h) {
  if (setjmp(s->error.jump)) return false;
  jpeg_create_decompress(&s->cinfo);
  s->cinfo.mem->max_memory_to_use = max_memory;
  jpeg_mem_src(&s->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&s->cinfo, TRUE);
  const J_COLOR_SPACE space = s->cinfo.jpeg_color_space;
  if (space == JCS_CMYK || space == JCS_YCCK) {
    std::snprintf(s->error.message, sizeof s->error.message,
                  "CMYK JPEG is not supported (convert the image to RGB)");
    return false;
  }
  s->cinfo.out_color_space = space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  s->cinfo.scale_num = 1;
  s->cinfo.scale_denom = static_cast<unsigned int>(scale_denom);
  // The accurate integer IDCT: with libjpeg-turbo's SIMD it costs what
  // JDCT_IFAST does (0.80 against 0.79 ms for a 400x400 quality-90 picture of
  // data/synthetic_images.h, libjpeg-turbo 2.1.5, 2026-11-26; the entropy
  // decoding dominates), and scaled decodes use the reduced-size IDCTs
  // whatever the method.
  s->cinfo.dct_method = JDCT_ISLOW;
  s->cinfo.do_fancy_upsampling = TRUE;
  jpeg_calc_output_dimensions(&s->cinfo);
  h->height = s->cinfo.output_height;
  h->width = s->cinfo.output_width;
  h->channels = s->cinfo.output_components;
  h->row_bytes = static_cast<size_t>(h->width) * static_cast<size_t>(h->channels);
  return true;
}

// Decodes straight into the caller's rows (one pointer per output row),
// asking for every row left at each call: libjpeg returns as many as its
// current block row holds, converting colour into them without a copy.
bool read_jpeg_pixels(JpegReadState* s, JSAMPROW* rows) {
  if (setjmp(s->error.jump)) return false;
  jpeg_start_decompress(&s->cinfo);
  while (s->cinfo.output_scanline < s->cinfo.output_height) {
    const JDIMENSION done = s->cinfo.output_scanline;
    jpeg_read_scanlines(&s->cinfo, rows + done, s->cinfo.output_height - done);
  }
  jpeg_finish_decompress(&s->cinfo);
  return true;
}

class JpegReader {
 public:
  JpegReader() {
    std::memset(&state_.cinfo, 0, sizeof state_.cinfo);
    init_jpeg_error(&state_.error);
    state_.cinfo.err = &state_.error.mgr;
    state_.cinfo.client_data = &state_.error;
  }
  ~JpegReader() { jpeg_destroy_decompress(&state_.cinfo); }  // safe when never created
  JpegReader(const JpegReader&) = delete;
  JpegReader& operator=(const JpegReader&) = delete;

  JpegReadState* state() { return &state_; }

 private:
  JpegReadState state_;
};

// libjpeg's working memory: a progressive JPEG keeps every DCT coefficient of
// the image (at most 3 components x 2 bytes a pixel, plus the padding of the
// edge blocks) from jpeg_start_decompress on. libjpeg would need a backing
// store beyond this limit; the usual builds have none and fail instead.
long jpeg_memory_limit(int64_t max_pixels) {
  constexpr int64_t kSlack = int64_t{64} << 20;
  const int64_t most = std::numeric_limits<long>::max();
  return static_cast<long>(max_pixels > (most - kSlack) / 6 ? most : 6 * max_pixels + kSlack);
}

// Reads the header at 1/scale_denom and checks the file's size against the
// budget; the reader is then ready for read_jpeg_pixels.
DecodedHeader open_jpeg(JpegReader& reader, const std::vector<uint8_t>& bytes,
                        const std::string& what, int64_t max_pixels, int scale_denom) {
  DecodedHeader h;
  JpegReadState* s = reader.state();
  if (!read_jpeg_header(s, bytes.data(), bytes.size(), jpeg_memory_limit(max_pixels), scale_denom,
                        &h))
    FORGE_FAIL("{}: invalid JPEG: {}", what, s->error.message);
  check_pixel_budget(what, "JPEG", s->cinfo.image_width, s->cinfo.image_height, max_pixels);
  FORGE_CHECK(h.channels == 1 || h.channels == 3,
              "{}: JPEG decodes to {} channels, expected 1 or 3", what, h.channels);
  return h;
}

Image decode_jpeg(const std::vector<uint8_t>& bytes, const std::string& what, int64_t max_pixels,
                  int scale_denom) {
  JpegReader reader;
  const DecodedHeader h = open_jpeg(reader, bytes, what, max_pixels, scale_denom);
  Image image{h.height, h.width, h.channels, {}};
  image.pixels.resize(static_cast<size_t>(h.height) * h.row_bytes);
  std::vector<JSAMPROW> rows = row_pointers(image.pixels.data(), h.height, h.row_bytes);
  if (!read_jpeg_pixels(reader.state(), rows.data()))
    FORGE_FAIL("{}: invalid JPEG: {}", what, reader.state()->error.message);
  return image;
}

// A region of a JPEG in two steps around the caller's allocations (libjpeg's
// errors longjmp out of these, so they hold nothing that needs destroying):
// start_jpeg_region starts the decompression, narrows it to the block
// columns holding [want.left, want.left + want.width) and sets `got` (those
// columns, and the rows from the iMCU row above the one holding want.top);
// read_jpeg_region reads got's rows into `rows` and skips the rest but for
// the last row, read into `last`, so that a truncated file fails here too.
bool start_jpeg_region(JpegReadState* s, const ImageRegion& want, ImageRegion* got) {
  if (setjmp(s->error.jump)) return false;
  jpeg_decompress_struct& c = s->cinfo;
  jpeg_start_decompress(&c);
  // Fancy upsampling at a cropped edge sees no neighbour: the columns asked
  // for are widened by a block column (16 pixels at most) on each side first,
  // so that their pixels are the whole decode's.
  // A progressive JPEG is decoded whole: its block smoothing reads
  // neighbouring blocks that a crop leaves out (the fuzzer found pixels that
  // differ), and its coefficients are all read before the first row anyway.
  const bool whole = jpeg_has_multiple_scans(&c);
  const int64_t width = c.output_width;
  const int64_t left = whole ? 0 : std::max<int64_t>(want.left - 16, 0);
  const int64_t right = whole ? width : std::min<int64_t>(want.left + want.width + 16, width);
  JDIMENSION x0 = static_cast<JDIMENSION>(left), w = static_cast<JDIMENSION>(right - left);
  if (left > 0 || right < width) jpeg_crop_scanline(&c, &x0, &w);  // to block boundaries
  // Rows: whole iMCU rows are skipped, and the one above the region's first
  // is read too (what fancy upsampling and block smoothing take as context).
  const int64_t imcu = static_cast<int64_t>(c.max_v_samp_factor) * c.min_DCT_scaled_size;
  const int64_t top = whole ? 0 : std::max<int64_t>(0, (want.top / imcu - 1) * imcu);
  *got = {top, static_cast<int64_t>(x0), want.top + want.height - top,
          static_cast<int64_t>(c.output_width)};
  return true;
}

bool read_jpeg_region(JpegReadState* s, const ImageRegion& got, JSAMPROW* rows, JSAMPROW last) {
  if (setjmp(s->error.jump)) return false;
  jpeg_decompress_struct& c = s->cinfo;
  if (got.top > 0) jpeg_skip_scanlines(&c, static_cast<JDIMENSION>(got.top));
  const auto end = static_cast<JDIMENSION>(got.top + got.height);
  while (c.output_scanline < end) {
    const JDIMENSION done = c.output_scanline - static_cast<JDIMENSION>(got.top);
    jpeg_read_scanlines(&c, rows + done, end - c.output_scanline);
  }
  const JDIMENSION rest = c.output_height - c.output_scanline;
  if (rest > 1) jpeg_skip_scanlines(&c, rest - 1);
  while (c.output_scanline < c.output_height) jpeg_read_scanlines(&c, &last, 1);
  jpeg_finish_decompress(&c);
  return true;
}

struct JpegWriteState {
  jpeg_compress_struct cinfo;
  JpegError error;
  unsigned char* out = nullptr;  // malloc'd by libjpeg's memory destination
  unsigned long out_size = 0;
};

bool encode_jpeg_rows(JpegWriteState* s, const Image* image, int quality) {
  if (setjmp(s->error.jump)) return false;
  jpeg_create_compress(&s->cinfo);
  jpeg_mem_dest(&s->cinfo, &s->out, &s->out_size);
  s->cinfo.image_width = static_cast<JDIMENSION>(image->width);
  s->cinfo.image_height = static_cast<JDIMENSION>(image->height);
  s->cinfo.input_components = static_cast<int>(image->channels);
  s->cinfo.in_color_space = image->channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&s->cinfo);
  jpeg_set_quality(&s->cinfo, quality, TRUE);
  jpeg_start_compress(&s->cinfo, TRUE);
  const size_t row_bytes = static_cast<size_t>(image->width * image->channels);
  while (s->cinfo.next_scanline < s->cinfo.image_height) {
    // libjpeg does not write through the row pointer; its API is not const.
    JSAMPROW row = const_cast<uint8_t*>(image->pixels.data()) +
                   static_cast<size_t>(s->cinfo.next_scanline) * row_bytes;
    jpeg_write_scanlines(&s->cinfo, &row, 1);
  }
  jpeg_finish_compress(&s->cinfo);
  return true;
}

class JpegWriter {
 public:
  JpegWriter() {
    std::memset(&state_.cinfo, 0, sizeof state_.cinfo);
    init_jpeg_error(&state_.error);
    state_.cinfo.err = &state_.error.mgr;
    state_.cinfo.client_data = &state_.error;
  }
  ~JpegWriter() {
    jpeg_destroy_compress(&state_.cinfo);
    std::free(state_.out);
  }
  JpegWriter(const JpegWriter&) = delete;
  JpegWriter& operator=(const JpegWriter&) = delete;

  JpegWriteState* state() { return &state_; }

 private:
  JpegWriteState state_;
};

// ---------------------------------------------------------------- files ----

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

std::vector<uint8_t> read_file(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  FORGE_CHECK(f != nullptr, "cannot open image file '{}': {}", path, std::strerror(errno));
  std::vector<uint8_t> bytes;
  uint8_t chunk[1 << 16];
  for (;;) {
    const size_t n = std::fread(chunk, 1, sizeof chunk, f.get());
    bytes.insert(bytes.end(), chunk, chunk + n);
    if (n < sizeof chunk) break;
  }
  FORGE_CHECK(!std::ferror(f.get()), "cannot read image file '{}': {}", path, std::strerror(errno));
  return bytes;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  File f(std::fopen(path.c_str(), "wb"));
  FORGE_CHECK(f != nullptr, "cannot create image file '{}': {}", path, std::strerror(errno));
  const size_t n = std::fwrite(bytes.data(), 1, bytes.size(), f.get());
  FORGE_CHECK(n == bytes.size(), "cannot write image file '{}' ({} of {} bytes written): {}", path,
              n, bytes.size(), std::strerror(errno));
  FORGE_CHECK(std::fclose(f.release()) == 0, "cannot write image file '{}': {}", path,
              std::strerror(errno));
}

}  // namespace

Image decode_image(const std::vector<uint8_t>& bytes, const std::string& what, int64_t max_pixels,
                   int scale_denom) {
  check_decode_arguments(what, max_pixels, scale_denom);
  if (has_png_signature(bytes)) return decode_png(bytes, what, max_pixels);
  if (has_jpeg_signature(bytes)) return decode_jpeg(bytes, what, max_pixels, scale_denom);
  fail_not_an_image(bytes, what);
}

Image decode_image_region(const std::vector<uint8_t>& bytes, const std::string& what,
                          int64_t max_pixels, int scale_denom, const ImageRegion& want,
                          ImageRegion& got) {
  check_decode_arguments(what, max_pixels, scale_denom);
  if (!has_jpeg_signature(bytes)) {
    Image whole = decode_image(bytes, what, max_pixels, scale_denom);
    got = {0, 0, whole.height, whole.width};
    return whole;
  }
  JpegReader reader;
  const DecodedHeader h = open_jpeg(reader, bytes, what, max_pixels, scale_denom);
  FORGE_CHECK(want.top >= 0 && want.left >= 0 && want.height >= 1 && want.width >= 1 &&
                  want.top + want.height <= h.height && want.left + want.width <= h.width,
              "{}: region [{}, {}) x [{}, {}) is outside the {}x{} picture", what, want.top,
              want.top + want.height, want.left, want.left + want.width, h.height, h.width);
  JpegReadState* st = reader.state();
  if (!start_jpeg_region(st, want, &got))
    FORGE_FAIL("{}: invalid JPEG: {}", what, st->error.message);
  const size_t row_bytes = static_cast<size_t>(got.width) * static_cast<size_t>(h.channels);
  Image out{got.height, got.width, h.channels, {}};
  out.pixels.resize(static_cast<size_t>(got.height) * row_bytes);
  std::vector<JSAMPROW> rows = row_pointers(out.pixels.data(), got.height, row_bytes);
  std::vector<JSAMPLE> last(row_bytes);
  if (!read_jpeg_region(st, got, rows.data(), last.data()))
    FORGE_FAIL("{}: invalid JPEG: {}", what, st->error.message);
  return out;
}

Image read_image(const std::string& path, int64_t max_pixels, int scale_denom) {
  return decode_image(read_file(path), path, max_pixels, scale_denom);
}

void check_image(const Image& image, const char* what) {
  FORGE_CHECK(image.channels == 1 || image.channels == 3,
              "{}: expected an image with 1 or 3 channels, got {}", what, image.channels);
  FORGE_CHECK(image.height > 0 && image.width > 0, "{}: expected a non-empty image, got {}x{}",
              what, image.height, image.width);
  FORGE_CHECK(
      static_cast<int64_t>(image.pixels.size()) == image.height * image.width * image.channels,
      "{}: a {}x{}x{} image needs {} pixel bytes, has {}", what, image.height, image.width,
      image.channels, image.height * image.width * image.channels, image.pixels.size());
}

std::vector<uint8_t> read_image_bytes(const std::string& path) {
  return read_file(path);
}

ImageHeader read_image_header(const std::vector<uint8_t>& bytes, const std::string& what,
                              int64_t max_pixels) {
  check_decode_arguments(what, max_pixels, 1);
  if (has_png_signature(bytes)) {
    PngReader reader(bytes, what);
    PngState* s = reader.state();
    if (!read_png_info(s)) FORGE_FAIL("{}: invalid PNG: {}", what, s->message);
    const int64_t width = png_get_image_width(s->png, s->info);
    const int64_t height = png_get_image_height(s->png, s->info);
    check_pixel_budget(what, "PNG", width, height, max_pixels);
    // Palette types carry the colour bit; alpha is dropped by the decoder.
    const bool color = (png_get_color_type(s->png, s->info) & PNG_COLOR_MASK_COLOR) != 0;
    return ImageHeader{height, width, color ? 3 : 1, false};
  }
  if (has_jpeg_signature(bytes)) {
    JpegReader reader;
    const DecodedHeader h = open_jpeg(reader, bytes, what, max_pixels, 1);
    return ImageHeader{h.height, h.width, h.channels, true};
  }
  fail_not_an_image(bytes, what);
}

int jpeg_scale_denom(int64_t height, int64_t width, int64_t need_height, int64_t need_width,
                     double min_ratio) {
  FORGE_CHECK(height >= 1 && width >= 1 && need_height >= 1 && need_width >= 1,
              "jpeg_scale_denom: sizes must be at least 1, got a {}x{} region for {}x{}", height,
              width, need_height, need_width);
  FORGE_CHECK(min_ratio >= 2,
              "jpeg_scale_denom: min_ratio must be at least 2 (below it the decode would keep "
              "fewer pixels than the resize needs), got {}",
              min_ratio);
  const double keep_h = static_cast<double>(need_height) * min_ratio / 2;
  const double keep_w = static_cast<double>(need_width) * min_ratio / 2;
  for (int d : {8, 4, 2})
    if (static_cast<double>(height) / d >= keep_h && static_cast<double>(width) / d >= keep_w)
      return d;
  return 1;
}

std::vector<uint8_t> encode_png(const Image& image) {
  check_encodable(image, "PNG", PNG_USER_WIDTH_MAX);
  std::vector<uint8_t> out;
  PngWriter writer(&out);
  // libpng reads the rows through non-const pointers but does not modify them.
  std::vector<png_bytep> rows =
      row_pointers(const_cast<uint8_t*>(image.pixels.data()), image.height,
                   static_cast<size_t>(image.width * image.channels));
  if (!encode_png_rows(writer.state(), &image, rows.data()))
    FORGE_FAIL("PNG encoder: {}", writer.state()->message);
  return out;
}

std::vector<uint8_t> encode_jpeg(const Image& image, int quality) {
  check_encodable(image, "JPEG", JPEG_MAX_DIMENSION);
  FORGE_CHECK(quality >= 1 && quality <= 100, "JPEG encoder: quality must be in 1..100, got {}",
              quality);
  JpegWriter writer;
  if (!encode_jpeg_rows(writer.state(), &image, quality))
    FORGE_FAIL("JPEG encoder: {}", writer.state()->error.message);
  const JpegWriteState* s = writer.state();
  return std::vector<uint8_t>(s->out, s->out + s->out_size);
}

void write_png(const std::string& path, const Image& image) {
  write_file(path, encode_png(image));
}

void write_jpeg(const std::string& path, const Image& image, int quality) {
  write_file(path, encode_jpeg(image, quality));
}

}  // namespace forge::data
