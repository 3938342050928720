#include "data/image_file.h"

#include <cstddef>
#include <cstdio>
// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>
// jerror.h after jpeglib.h: the warning codes
#include <jerror.h>
#include <png.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <type_traits>

#include "core/error.h"

namespace dtrain {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormats = "PNG, JPEG, PGM or PPM";

[[noreturn]] void bad_image(const fs::path& file, const std::string& what) {
  throw Error(fmt::format("{}: {}", file.string(), what),
              fmt::format("pass {} images (a directory contributes its files with those "
                          "extensions)",
                          kFormats));
}

std::string slurp(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) bad_image(file, fmt::format("cannot open it: {}", std::strerror(errno)));
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The most pixels an image may have: Pillow's limit (twice its decompression-bomb
// warning, 89,478,485), 537 MB of decoded RGB, which resampling reads as it is.
constexpr int64_t kMaxPixels = 178956970;

std::string too_large(int64_t w, int64_t h) {
  return fmt::format("{} x {} pixels, more than {} (Pillow's limit too): shrink it first", w, h,
                     kMaxPixels);
}

// The Orientation tag (0x0112) of an Exif block: a TIFF header ("II" or "MM", 42, the
// first directory's offset) and that directory's entries, after the "Exif\0\0" that
// JPEG's APP1 puts before it (PNG's eXIf holds the TIFF block alone). 1 (as stored) where the block
// is absent, damaged or says something other than 1-8: a camera's odd metadata never refuses its
// pixels.
int exif_orientation(const uint8_t* data, size_t size) {
  if (size >= 6 && std::memcmp(data, "Exif\0\0", 6) == 0) {
    data += 6;
    size -= 6;
  }
  if (size < 8) return 1;
  const bool little = data[0] == 'I' && data[1] == 'I';
  if (!little && !(data[0] == 'M' && data[1] == 'M')) return 1;
  auto u16 = [&](size_t at) -> unsigned {
    return little ? data[at] | data[at + 1] << 8 : data[at] << 8 | data[at + 1];
  };
  auto u32 = [&](size_t at) -> uint32_t {
    return little ? uint32_t{u16(at)} | uint32_t{u16(at + 2)} << 16
                  : uint32_t{u16(at)} << 16 | uint32_t{u16(at + 2)};
  };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > size - 2) return 1;
  const size_t entries = u16(ifd);
  for (size_t e = 0; e < entries; ++e) {
    const size_t at = ifd + 2 + e * 12;
    if (at + 12 > size) return 1;
    // SHORT (type 3), one value, held in the entry's first two value bytes.
    if (u16(at) == 0x0112 && u16(at + 2) == 3 && u32(at + 4) == 1) {
      const unsigned v = u16(at + 8);
      return v >= 1 && v <= 8 ? static_cast<int>(v) : 1;
    }
  }
  return 1;
}

// The pixels turned upright as Exif `orientation` asks (PIL's ImageOps.exif_transpose):
// 2 mirrored left-right, 3 turned 180 degrees, 4 mirrored top-bottom, 5 transposed,
// 6 turned 90 degrees clockwise, 7 transversed, 8 turned 90 degrees counter-clockwise.
void make_upright(DecodedImage& img, int orientation) {
  if (orientation <= 1 || orientation > 8) return;
  const int w = img.width, h = img.height, c = img.channels;
  const bool swap = orientation >= 5;
  const int ow = swap ? h : w, oh = swap ? w : h;
  std::vector<uint8_t> out(img.pixels.size());
  for (int r = 0; r < oh; ++r) {
    for (int col = 0; col < ow; ++col) {
      int sr = r, sc = col;  // the stored pixel shown at (r, col)
      switch (orientation) {
        case 2:
          sc = w - 1 - col;
          break;
        case 3:
          sr = h - 1 - r;
          sc = w - 1 - col;
          break;
        case 4:
          sr = h - 1 - r;
          break;
        case 5:
          sr = col;
          sc = r;
          break;
        case 6:
          sr = h - 1 - col;
          sc = r;
          break;
        case 7:
          sr = h - 1 - col;
          sc = w - 1 - r;
          break;
        default:
          sr = col;
          sc = w - 1 - r;
          break;  // 8
      }
      std::memcpy(out.data() + (static_cast<size_t>(r) * ow + col) * c,
                  img.pixels.data() + (static_cast<size_t>(sr) * w + sc) * c, c);
    }
  }
  img.pixels = std::move(out);
  img.width = ow;
  img.height = oh;
  img.orientation = orientation;
}

// libpng's and libjpeg's errors come by longjmp back to the decoder's setjmp: what the
// decoders fill lives in the caller's frame (not skipped by the jump), and the decoders
// hold nothing with a destructor.
struct CodecError {
  std::jmp_buf jump;
  std::string message;
};

struct PngSource {
  const std::string* bytes = nullptr;
  size_t at = 0;
};

void png_fail(png_structp png, png_const_charp msg) {
  auto* e = static_cast<CodecError*>(png_get_error_ptr(png));
  if (e->message.empty()) e->message = msg;  // a reason of ours set before png_error stays
  std::longjmp(e->jump, 1);
}

void png_quiet(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->bytes->size() - src->at) png_error(png, "the file ends inside the image data");
  std::memcpy(out, src->bytes->data() + src->at, n);
  src->at += n;
}

// Samples as stored, 16-bit ones by their high byte, palettes and low bit depths expanded;
// no gamma applied (what PIL and torchvision read). `raw` gets rows of `channels` bytes per
// pixel: 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA.
void decode_png(const std::string& bytes, std::vector<uint8_t>& raw, std::vector<png_bytep>& rows,
                int& width, int& height, int& channels, int& orientation, CodecError& err,
                bool& failed) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, png_fail, png_quiet);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    err.message = "libpng could not start";
    failed = true;
    return;
  }
  PngSource src{&bytes, 0};
  if (setjmp(err.jump) != 0) {
    png_destroy_read_struct(&png, &info, nullptr);
    failed = true;
    return;
  }
  png_set_read_fn(png, &src, png_read_bytes);
  png_read_info(png, info);
  // An eXIf chunk before the image data (where writers put it; one after it is not read,
  // as the file is not read past the pixels).
  png_uint_32 exif_size = 0;
  png_bytep exif = nullptr;
  if (png_get_eXIf_1(png, info, &exif_size, &exif) != 0 && exif != nullptr)
    orientation = exif_orientation(exif, exif_size);
  width = static_cast<int>(png_get_image_width(png, info));
  height = static_cast<int>(png_get_image_height(png, info));
  if (int64_t{width} * height > kMaxPixels) {
    err.message = too_large(width, height);
    png_error(png, "too large");
  }
  png_set_expand(png);              // palette to RGB, gray below 8 bits to 8, tRNS to alpha
  png_set_strip_16(png);            // 16-bit samples: their high byte
  png_set_interlace_handling(png);  // Adam7: png_read_image assembles the passes
  png_read_update_info(png, info);
  channels = png_get_channels(png, info);
  const size_t row_bytes = png_get_rowbytes(png, info);
  raw.resize(row_bytes * static_cast<size_t>(height));
  rows.resize(static_cast<size_t>(height));
  for (int y = 0; y < height; ++y) rows[static_cast<size_t>(y)] = raw.data() + row_bytes * y;
  png_read_image(png, rows.data());
  // Not png_read_end: the pixels are read and checked; a file cut after them (no IEND)
  // still gives them, as PIL does.
  png_destroy_read_struct(&png, &info, nullptr);
}

DecodedImage read_png(const fs::path& file, const std::string& bytes) {
  std::vector<uint8_t> raw;
  std::vector<png_bytep> rows;
  int w = 0, h = 0, c = 0, orientation = 1;
  CodecError err;
  bool failed = false;
  decode_png(bytes, raw, rows, w, h, c, orientation, err, failed);
  if (failed) bad_image(file, fmt::format("PNG data unreadable: {}", err.message));
  DecodedImage out;
  out.width = w;
  out.height = h;
  out.format = "png";
  out.channels = c >= 3 ? 3 : 1;
  const bool alpha = c == 2 || c == 4;
  out.pixels.resize(static_cast<size_t>(w) * h * out.channels);
  for (size_t p = 0; p < static_cast<size_t>(w) * h; ++p) {
    const uint8_t* px = raw.data() + p * c;
    const unsigned a = alpha ? px[c - 1] : 255;  // onto black: v * a / 255, rounded
    for (int k = 0; k < out.channels; ++k)
      out.pixels[p * out.channels + k] = static_cast<uint8_t>((px[k] * a + 127) / 255);
  }
  make_upright(out, orientation);
  return out;
}

struct JpegError {
  jpeg_error_mgr mgr;  // first: libjpeg's err pointer is this struct's address
  CodecError* codec = nullptr;
  std::string warning;  // the last warning that pixels were made up
  int corrupt = 0;      // such warnings
};
static_assert(std::is_standard_layout_v<JpegError>);

void jpeg_fail(j_common_ptr info) {
  auto* e = reinterpret_cast<JpegError*>(info->err);
  char text[JMSG_LENGTH_MAX];
  (*info->err->format_message)(info, text);
  e->codec->message = text;
  std::longjmp(e->codec->jump, 1);
}

// The warnings (level -1) after which libjpeg makes pixels up (a truncated file's grey
// tail, a damaged entropy segment) are kept and refused below; the others (extra bytes
// between markers, an unknown JFIF version, an odd ICC profile) leave the pixels whole.
void jpeg_note(j_common_ptr info, int level) {
  auto* e = reinterpret_cast<JpegError*>(info->err);
  const int code = info->err->msg_code;
  if (level < 0 && (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_MUST_RESYNC ||
                    code == JWRN_HUFF_BAD_CODE || code == JWRN_ARITH_BAD_CODE)) {
    char text[JMSG_LENGTH_MAX];
    (*info->err->format_message)(info, text);
    e->warning = text;
    ++e->corrupt;
  }
}

// A CMYK (or YCCK) JPEG decodes to its 4 channels; read_jpeg makes them RGB.
void decode_jpeg(const std::string& bytes, DecodedImage& out, int& orientation, JpegError& err,
                 bool& failed) {
  jpeg_decompress_struct info;
  info.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_fail;
  err.mgr.emit_message = jpeg_note;
  if (setjmp(err.codec->jump) != 0) {
    jpeg_destroy_decompress(&info);
    failed = true;
    return;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&info, JPEG_APP0 + 1, 0xFFFF);  // APP1: Exif
  jpeg_read_header(&info, TRUE);
  for (jpeg_saved_marker_ptr m = info.marker_list; m != nullptr; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 &&
        std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      orientation = exif_orientation(m->data, m->data_length);
      break;
    }
  }
  const bool cmyk = info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK;
  if (int64_t{info.image_width} * info.image_height > kMaxPixels) {
    err.codec->message = too_large(info.image_width, info.image_height);
    jpeg_destroy_decompress(&info);
    failed = true;
    return;
  }
  info.out_color_space = cmyk ? JCS_CMYK : info.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_start_decompress(&info);
  out.width = static_cast<int>(info.output_width);
  out.height = static_cast<int>(info.output_height);
  out.channels = info.output_components;
  out.pixels.resize(static_cast<size_t>(out.width) * out.height * out.channels);
  while (info.output_scanline < info.output_height) {
    JSAMPROW row =
        out.pixels.data() + static_cast<size_t>(info.output_scanline) * out.width * out.channels;
    jpeg_read_scanlines(&info, &row, 1);
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
}

DecodedImage read_jpeg(const fs::path& file, const std::string& bytes) {
  DecodedImage out;
  out.format = "jpeg";
  CodecError codec;
  JpegError err{};
  err.codec = &codec;
  bool failed = false;
  int orientation = 1;
  decode_jpeg(bytes, out, orientation, err, failed);
  if (failed) bad_image(file, fmt::format("JPEG data unreadable: {}", codec.message));
  if (err.corrupt > 0)
    bad_image(file, fmt::format("JPEG data corrupt or truncated: {}", err.warning));
  // CMYK to RGB as Pillow converts it: each value taken as stored inverted (Adobe's
  // convention, which Pillow assumes for every CMYK JPEG), then (255 - C)(255 - K) / 255.
  if (out.channels == 4) {
    const size_t n = static_cast<size_t>(out.width) * out.height;
    for (size_t p = 0; p < n; ++p) {
      const uint8_t* in = out.pixels.data() + 4 * p;
      const int nk = in[3];  // 255 - K, K = 255 - stored
      uint8_t rgb[3];
      for (int c = 0; c < 3; ++c) {
        const int t = (255 - in[c]) * nk + 128;
        rgb[c] = static_cast<uint8_t>(std::clamp(nk - (((t >> 8) + t) >> 8), 0, 255));
      }
      std::memcpy(out.pixels.data() + 3 * p, rgb, 3);
    }
    out.pixels.resize(3 * n);
    out.channels = 3;
  }
  if (out.channels != 1 && out.channels != 3)
    bad_image(file, fmt::format("a JPEG of {} channels", out.channels));
  make_upright(out, orientation);
  return out;
}

// Netpbm: P2 / P5 gray, P3 / P6 RGB; a header of whitespace-separated numbers with
// #-comments; maxval up to 65535 (two bytes per sample, big-endian, in P5 / P6).
DecodedImage read_pnm(const fs::path& file, const std::string& bytes) {
  const char kind = bytes[1];
  size_t at = 2;
  auto number = [&](const char* what) {
    for (;;) {
      while (at < bytes.size() && std::isspace(static_cast<unsigned char>(bytes[at]))) ++at;
      if (at < bytes.size() && bytes[at] == '#') {
        while (at < bytes.size() && bytes[at] != '\n') ++at;
        continue;
      }
      break;
    }
    if (at >= bytes.size() || !std::isdigit(static_cast<unsigned char>(bytes[at])))
      bad_image(file, fmt::format("netpbm header: no {}", what));
    int64_t v = 0;
    while (at < bytes.size() && std::isdigit(static_cast<unsigned char>(bytes[at]))) {
      v = v * 10 + (bytes[at++] - '0');
      if (v > (int64_t{1} << 30)) bad_image(file, fmt::format("netpbm header: {} too large", what));
    }
    return v;
  };
  DecodedImage out;
  out.channels = kind == '2' || kind == '5' ? 1 : 3;
  out.format = out.channels == 1 ? "pgm" : "ppm";
  const int64_t w = number("width"), h = number("height"), maxval = number("maxval");
  if (w < 1 || h < 1) bad_image(file, fmt::format("netpbm size {}x{}", w, h));
  if (w * h > kMaxPixels) bad_image(file, too_large(w, h));
  if (maxval < 1 || maxval > 65535) bad_image(file, fmt::format("netpbm maxval {}", maxval));
  out.width = static_cast<int>(w);
  out.height = static_cast<int>(h);
  const size_t samples = static_cast<size_t>(w * h * out.channels);
  out.pixels.resize(samples);
  auto scaled = [&](int64_t v) {
    if (v > maxval) bad_image(file, fmt::format("a sample of {} above maxval {}", v, maxval));
    return static_cast<uint8_t>((v * 255 + maxval / 2) / maxval);
  };
  if (kind == '2' || kind == '3') {
    for (size_t i = 0; i < samples; ++i) out.pixels[i] = scaled(number("sample"));
    return out;
  }
  ++at;  // the single whitespace after maxval
  const size_t width = maxval > 255 ? 2 : 1;
  if (at > bytes.size() || bytes.size() - at < samples * width)
    bad_image(file, fmt::format("truncated: {} bytes of pixels, {} expected",
                                bytes.size() - std::min(at, bytes.size()), samples * width));
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + at;
  for (size_t i = 0; i < samples; ++i)
    out.pixels[i] = scaled(width == 2 ? (p[2 * i] << 8 | p[2 * i + 1]) : p[i]);
  return out;
}

// Resampling weights along one axis: output o of `n_out` covers the input span
// [lo, hi) = [c - r, c + r) around its centre c (the middle `n_out / scale` input
// samples when cropping); each input sample weighs its overlap with the span (area
// averaging, scale <= 1) or its tent distance from c (bilinear, scale > 1).
struct Taps {
  std::vector<int> first;
  std::vector<std::vector<float>> w;
};

Taps taps(int n_in, int n_out, double scale, double offset) {
  Taps t;
  for (int o = 0; o < n_out; ++o) {
    const double c = offset + (o + 0.5) / scale;  // in input coordinates
    std::vector<float> w;
    int first = 0;
    if (scale <= 1.0) {
      const double lo = c - 0.5 / scale, hi = c + 0.5 / scale;
      first = std::max(0, static_cast<int>(std::floor(lo)));
      const int last = std::min(n_in - 1, static_cast<int>(std::ceil(hi)) - 1);
      for (int i = first; i <= last; ++i)
        w.push_back(static_cast<float>(std::min<double>(hi, i + 1) - std::max<double>(lo, i)));
    } else {
      const double x = std::clamp(c - 0.5, 0.0, static_cast<double>(n_in - 1));
      first = std::min(static_cast<int>(x), std::max(0, n_in - 2));
      const double f = x - first;
      w = {static_cast<float>(1.0 - f)};
      if (n_in > 1) w.push_back(static_cast<float>(f));
    }
    float sum = 0;
    for (float v : w) sum += v;
    for (float& v : w) v /= sum;
    t.first.push_back(first);
    t.w.push_back(std::move(w));
  }
  return t;
}

}  // namespace

DecodedImage read_image_file(const fs::path& file) {
  std::error_code ec;
  if (fs::is_directory(file, ec)) bad_image(file, "a directory, not an image");
  const std::string bytes = slurp(file);
  if (bytes.empty()) bad_image(file, "an empty file");
  DecodedImage img;
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), "\x89PNG\r\n\x1a\n", 8) == 0) {
    img = read_png(file, bytes);
  } else if (bytes.size() >= 3 && static_cast<unsigned char>(bytes[0]) == 0xFF &&
             static_cast<unsigned char>(bytes[1]) == 0xD8 &&
             static_cast<unsigned char>(bytes[2]) == 0xFF) {
    img = read_jpeg(file, bytes);
  } else if (bytes.size() >= 3 && bytes[0] == 'P' && std::strchr("2356", bytes[1]) != nullptr &&
             bytes[1] != '\0' && std::isspace(static_cast<unsigned char>(bytes[2]))) {
    img = read_pnm(file, bytes);
  } else {
    bad_image(file, fmt::format("not a {} file (its first bytes say otherwise)", kFormats));
  }
  if (img.width < 1 || img.height < 1) bad_image(file, "an empty image");
  return img;
}

bool is_image_file_name(const fs::path& file) {
  std::string ext = file.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const char* known : {".png", ".jpg", ".jpeg", ".pgm", ".ppm", ".pnm"})
    if (ext == known) return true;
  return false;
}

namespace {

// Channel c of the model's input at pixel p of the image, in [0, 1]: the image's own
// channel, gray repeated to RGB, or RGB made gray by BT.601 luma.
float model_value(const DecodedImage& image, int channels, int c, size_t p) {
  const uint8_t* px = image.pixels.data() + p * static_cast<size_t>(image.channels);
  if (channels == image.channels) return px[c] / 255.0f;
  if (channels == 3) return px[0] / 255.0f;  // gray to RGB
  return (0.299f * px[0] + 0.587f * px[1] + 0.114f * px[2]) / 255.0f;
}

// The image resampled to g's size along the taps (input columns x0 + tx.first, rows
// y0 + ty.first): rows first, then columns, straight from the 8-bit pixels, over the
// rows the taps read only; no float copy of the image is made.
std::vector<float> resample(const DecodedImage& image, const ImageGeometry& g, int x0, int y0,
                            const Taps& tx, const Taps& ty) {
  DTRAIN_CHECK(g.channels == 1 || g.channels == 3, "a model of {} channels", g.channels);
  int lo = std::numeric_limits<int>::max(), hi = 0;  // the rows read, relative to y0
  for (size_t o = 0; o < ty.first.size(); ++o) {
    lo = std::min(lo, ty.first[o]);
    hi = std::max(hi, ty.first[o] + static_cast<int>(ty.w[o].size()));
  }
  DTRAIN_CHECK(lo >= 0 && y0 + hi <= image.height, "rows [{}, {}) of {}", y0 + lo, y0 + hi,
               image.height);
  std::vector<float> out(static_cast<size_t>(g.pixels()));
  std::vector<float> rows(static_cast<size_t>(hi - lo) * g.width);
  for (int c = 0; c < g.channels; ++c) {
    for (int y = lo; y < hi; ++y) {
      const size_t row = static_cast<size_t>(y0 + y) * image.width + x0;
      for (int x = 0; x < g.width; ++x) {
        float s = 0;
        const std::vector<float>& w = tx.w[static_cast<size_t>(x)];
        const auto first = static_cast<size_t>(tx.first[static_cast<size_t>(x)]);
        for (size_t k = 0; k < w.size(); ++k)
          s += w[k] * model_value(image, g.channels, c, row + first + k);
        rows[static_cast<size_t>(y - lo) * g.width + x] = s;
      }
    }
    float* dst = out.data() + static_cast<size_t>(c) * g.height * g.width;
    for (int y = 0; y < g.height; ++y) {
      const std::vector<float>& w = ty.w[static_cast<size_t>(y)];
      const auto first = static_cast<size_t>(ty.first[static_cast<size_t>(y)] - lo);
      for (int x = 0; x < g.width; ++x) {
        float s = 0;
        for (size_t k = 0; k < w.size(); ++k) s += w[k] * rows[(first + k) * g.width + x];
        dst[static_cast<size_t>(y) * g.width + x] = s;
      }
    }
  }
  return out;
}

}  // namespace

std::vector<float> to_model_input(const DecodedImage& image, const ImageGeometry& g,
                                  double center_crop) {
  DTRAIN_CHECK(center_crop > 0 && center_crop <= 1, "center crop {}", center_crop);
  const int w_in = image.width, h_in = image.height;
  // The shorter side to the model's / center_crop, the middle cut out.
  const double scale =
      std::max(static_cast<double>(g.width) / w_in, static_cast<double>(g.height) / h_in) /
      center_crop;
  const Taps tx = taps(w_in, g.width, scale, (w_in - g.width / scale) / 2);
  const Taps ty = taps(h_in, g.height, scale, (h_in - g.height / scale) / 2);
  return resample(image, g, 0, 0, tx, ty);
}

std::vector<float> box_to_model_input(const DecodedImage& image, const ImageGeometry& g,
                                      const ImageBox& box) {
  DTRAIN_CHECK(box.x >= 0 && box.y >= 0 && box.width >= 1 && box.height >= 1 &&
                   box.x + box.width <= image.width && box.y + box.height <= image.height,
               "box {}x{} at ({}, {}) in an image {}x{}", box.width, box.height, box.x, box.y,
               image.width, image.height);
  const Taps tx = taps(box.width, g.width, static_cast<double>(g.width) / box.width, 0);
  const Taps ty = taps(box.height, g.height, static_cast<double>(g.height) / box.height, 0);
  return resample(image, g, box.x, box.y, tx, ty);
}

}  // namespace dtrain
