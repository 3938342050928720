// Image files for `dtrain predict`: PNG and JPEG written here by libpng and libjpeg
// themselves, and netpbm files by hand, read back pixel for pixel (JPEG within its
// loss); damaged files refused naming the file; and the model's input: channels
// converted, sizes matched by area averaging (a 2x enlarged image comes back exactly),
// bilinear growth and the middle cut out of a wide image.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
// jpeglib.h needs size_t and FILE declared before it.
#include <jpeglib.h>
#include <png.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/image_file.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  const fs::path d = fs::temp_directory_path() / ("dtrain-image-" + std::to_string(getpid()));
  fs::create_directories(d);
  return d;
}

void write_bytes(const fs::path& p, const std::string& s) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << s;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_png(const fs::path& p, int w, int h, uint32_t format, const void* pixels) {
  png_image img{};
  img.version = PNG_IMAGE_VERSION;
  img.width = static_cast<png_uint_32>(w);
  img.height = static_cast<png_uint_32>(h);
  img.format = format;
  REQUIRE(png_image_write_to_file(&img, p.c_str(), 0, pixels, 0, nullptr) != 0);
}

void write_jpeg(const fs::path& p, int w, int h, int channels, const std::vector<uint8_t>& px,
                const std::string& exif = {}, bool adobe_marker = true) {
  jpeg_compress_struct info;
  jpeg_error_mgr err;
  info.err = jpeg_std_error(&err);
  jpeg_create_compress(&info);
  FILE* f = std::fopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  jpeg_stdio_dest(&info, f);
  info.image_width = static_cast<JDIMENSION>(w);
  info.image_height = static_cast<JDIMENSION>(h);
  info.input_components = channels;
  info.in_color_space = channels == 1 ? JCS_GRAYSCALE : channels == 4 ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&info);
  jpeg_set_quality(&info, 100, TRUE);
  if (!adobe_marker) info.write_Adobe_marker = FALSE;
  jpeg_start_compress(&info, TRUE);
  if (!exif.empty())
    jpeg_write_marker(&info, JPEG_APP0 + 1, reinterpret_cast<const JOCTET*>(exif.data()),
                      static_cast<unsigned>(exif.size()));
  while (info.next_scanline < info.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(px.data()) +
                   static_cast<size_t>(info.next_scanline) * static_cast<size_t>(w * channels);
    jpeg_write_scanlines(&info, &row, 1);
  }
  jpeg_finish_compress(&info);
  jpeg_destroy_compress(&info);
  std::fclose(f);
}

// libpng's full writer: what the simplified one cannot write (Adam7 interlacing, a
// palette with transparency). `palette`: RGB triples, `trns`: their alphas.
void write_png_classic(const fs::path& p, int w, int h, int color_type,
                       const std::vector<uint8_t>& px, const std::vector<png_color>& palette = {},
                       const std::vector<uint8_t>& trns = {}, const std::string& exif = {}) {
  FILE* f = std::fopen(p.c_str(), "wb");
  REQUIRE(f != nullptr);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), 8, color_type,
               PNG_INTERLACE_ADAM7, PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  if (!palette.empty()) png_set_PLTE(png, info, palette.data(), static_cast<int>(palette.size()));
  if (!trns.empty()) png_set_tRNS(png, info, trns.data(), static_cast<int>(trns.size()), nullptr);
  if (!exif.empty())
    png_set_eXIf_1(png, info, static_cast<png_uint_32>(exif.size()),
                   reinterpret_cast<png_bytep>(const_cast<char*>(exif.data())));
  png_write_info(png, info);
  const size_t row = px.size() / static_cast<size_t>(h);
  std::vector<png_bytep> rows;
  for (int y = 0; y < h; ++y)
    rows.push_back(const_cast<uint8_t*>(px.data()) + static_cast<size_t>(y) * row);
  png_write_image(png, rows.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

std::vector<uint8_t> pattern(int w, int h, int c) {
  std::vector<uint8_t> px(static_cast<size_t>(w * h * c));
  for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * 37 + 11) % 256);
  return px;
}

std::string error_of(const fs::path& p) {
  try {
    read_image_file(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("PNG, JPEG and netpbm files read back their pixels") {
  const fs::path dir = temp_dir();
  const std::vector<uint8_t> gray = pattern(7, 5, 1), rgb = pattern(7, 5, 3);
  write_png(dir / "g.png", 7, 5, PNG_FORMAT_GRAY, gray.data());
  write_png(dir / "c.png", 7, 5, PNG_FORMAT_RGB, rgb.data());
  for (const auto& [name, want, channels] :
       {std::tuple{"g.png", &gray, 1}, std::tuple{"c.png", &rgb, 3}}) {
    CAPTURE(name);
    const DecodedImage img = read_image_file(dir / name);
    CHECK(img.format == "png");
    CHECK(img.width == 7);
    CHECK(img.height == 5);
    CHECK(img.channels == channels);
    CHECK(img.pixels == *want);
  }
  // Alpha is composited onto black: opaque pixels stay, transparent ones become 0.
  const std::vector<uint8_t> rgba = {200, 100, 50, 255, 200, 100, 50, 0};
  write_png(dir / "a.png", 2, 1, PNG_FORMAT_RGBA, rgba.data());
  const DecodedImage a = read_image_file(dir / "a.png");
  CHECK(a.channels == 3);
  CHECK(a.pixels == std::vector<uint8_t>{200, 100, 50, 0, 0, 0});
  // Half transparent: half the value (v * a / 255, rounded), as PIL composites.
  const std::vector<uint8_t> half = {200, 100, 51, 128};
  write_png(dir / "h.png", 1, 1, PNG_FORMAT_RGBA, half.data());
  CHECK(read_image_file(dir / "h.png").pixels == std::vector<uint8_t>{100, 50, 26});
  // Adam7-interlaced gray + alpha, and a palette with transparency: expanded, composited.
  std::vector<uint8_t> ga;
  for (int i = 0; i < 15; ++i) ga.insert(ga.end(), {static_cast<uint8_t>(17 * i), 255});
  ga[1] = 0;  // the first pixel transparent: black
  write_png_classic(dir / "ga.png", 5, 3, PNG_COLOR_TYPE_GRAY_ALPHA, ga);
  std::vector<uint8_t> want_ga;
  for (int i = 0; i < 15; ++i) want_ga.push_back(i == 0 ? 0 : static_cast<uint8_t>(17 * i));
  const DecodedImage gi = read_image_file(dir / "ga.png");
  CHECK(gi.channels == 1);
  CHECK(gi.pixels == want_ga);
  write_png_classic(dir / "pal.png", 3, 1, PNG_COLOR_TYPE_PALETTE, {0, 1, 1},
                    {{10, 20, 30}, {200, 100, 50}}, {255, 0});
  CHECK(read_image_file(dir / "pal.png").pixels ==
        std::vector<uint8_t>{10, 20, 30, 0, 0, 0, 0, 0, 0});
  // 16-bit samples: their high byte, no gamma (libpng's simplified reader would treat
  // them as linear light and re-encode them).
  const std::vector<uint16_t> deep = {0x8000, 0x1234};
  write_png(dir / "d.png", 2, 1, PNG_FORMAT_LINEAR_Y, deep.data());
  CHECK(read_image_file(dir / "d.png").pixels == std::vector<uint8_t>{0x80, 0x12});

  // Netpbm, binary and plain, with a comment and a 16-bit maxval.
  std::string p5 = "P5\n# a comment\n7 5\n255\n";
  p5.append(gray.begin(), gray.end());
  write_bytes(dir / "g.pgm", p5);
  std::string p6 = "P6 7 5 255\n";
  p6.append(rgb.begin(), rgb.end());
  write_bytes(dir / "c.ppm", p6);
  write_bytes(dir / "plain.pgm", "P2\n2 1\n15\n0 15\n");
  write_bytes(dir / "deep.pgm", std::string("P5 2 1 65535\n\xFF\xFF\x80\x00", 17));
  CHECK(read_image_file(dir / "g.pgm").pixels == gray);
  CHECK(read_image_file(dir / "c.ppm").pixels == rgb);
  CHECK(read_image_file(dir / "c.ppm").format == "ppm");
  CHECK(read_image_file(dir / "plain.pgm").pixels == std::vector<uint8_t>{0, 255});
  CHECK(read_image_file(dir / "deep.pgm").pixels == std::vector<uint8_t>{255, 128});

  // JPEG at quality 100: within a few levels of a smooth image.
  std::vector<uint8_t> smooth(16 * 16 * 3);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x)
      for (int c = 0; c < 3; ++c)
        smooth[static_cast<size_t>((y * 16 + x) * 3 + c)] =
            static_cast<uint8_t>(8 * x + 4 * y + 20 * c);
  write_jpeg(dir / "c.jpg", 16, 16, 3, smooth);
  const DecodedImage j = read_image_file(dir / "c.jpg");
  CHECK(j.format == "jpeg");
  CHECK(j.channels == 3);
  REQUIRE(j.pixels.size() == smooth.size());
  int worst = 0;
  for (size_t i = 0; i < smooth.size(); ++i)
    worst = std::max(worst, std::abs(int{j.pixels[i]} - int{smooth[i]}));
  CHECK(worst <= 4);
  std::vector<uint8_t> g16(16 * 16);
  for (size_t i = 0; i < g16.size(); ++i) g16[i] = smooth[3 * i];
  write_jpeg(dir / "g.jpeg", 16, 16, 1, g16);
  CHECK(read_image_file(dir / "g.jpeg").channels == 1);
  // CMYK, its values taken as stored inverted (as Pillow takes every CMYK JPEG): RGB as
  // Pillow's convert("RGB") gives, (255 - C)(255 - K) / 255 with C = 255 - stored.
  std::vector<uint8_t> cmyk(16 * 16 * 4);
  for (size_t i = 0; i < cmyk.size(); ++i)
    cmyk[i] = static_cast<uint8_t>(i % 4 == 3 ? 160 + (i / 4) % 64 : smooth[i / 4 * 3 + i % 4]);
  write_jpeg(dir / "cmyk.jpg", 16, 16, 4, cmyk);
  const DecodedImage k = read_image_file(dir / "cmyk.jpg");
  REQUIRE(k.channels == 3);
  REQUIRE(k.pixels.size() == smooth.size());
  // Without an Adobe marker too (Pillow assumes Adobe's inverted values for every one).
  write_jpeg(dir / "cmyk-plain.jpg", 16, 16, 4, cmyk, {}, false);
  CHECK(read_image_file(dir / "cmyk-plain.jpg").pixels == k.pixels);
  worst = 0;
  for (size_t p = 0; p < 256; ++p) {
    for (int c = 0; c < 3; ++c) {
      const double want = cmyk[4 * p + static_cast<size_t>(c)] * cmyk[4 * p + 3] / 255.0;
      worst = std::max(worst, static_cast<int>(std::lround(
                                  std::fabs(k.pixels[3 * p + static_cast<size_t>(c)] - want))));
    }
  }
  CHECK(worst <= 4);
  fs::remove_all(dir);
}

namespace {

// A TIFF block as cameras write it: header, one directory whose second entry is the
// Orientation tag (the first an ImageWidth, so the reader must walk the entries).
std::string exif_block(int orientation, bool big_endian, bool app1_prefix) {
  std::string t =
      big_endian ? std::string("MM\0\x2a\0\0\0\x08", 8) : std::string("II\x2a\0\x08\0\0\0", 8);
  auto u16 = [&](unsigned v) {
    if (big_endian) {
      t += static_cast<char>(v >> 8);
      t += static_cast<char>(v & 0xff);
    } else {
      t += static_cast<char>(v & 0xff);
      t += static_cast<char>(v >> 8);
    }
  };
  auto u32 = [&](uint32_t v) {
    if (big_endian) {
      u16(v >> 16);
      u16(v & 0xffff);
    } else {
      u16(v & 0xffff);
      u16(v >> 16);
    }
  };
  u16(2);  // entries
  u16(0x0100), u16(3), u32(1), u16(3), u16(0);
  u16(0x0112), u16(3), u32(1), u16(static_cast<unsigned>(orientation)), u16(0);
  u32(0);  // no next directory
  return app1_prefix ? std::string("Exif\0\0", 6) + t : t;
}

}  // namespace

TEST_CASE("a photo's Exif orientation turns its pixels upright, in PNG and JPEG") {
  const fs::path dir = temp_dir() / "exif";
  fs::create_directories(dir);
  // Stored:  a b c      (a 3 x 2 gray image)
  //          d e f
  const std::vector<uint8_t> stored = {20, 60, 100, 140, 180, 220};
  const uint8_t a = 20, b = 60, c = 100, d = 140, e = 180, f = 220;
  struct Upright {
    int w, h;
    std::vector<uint8_t> px;
  };
  const Upright want[9] = {{},
                           {3, 2, {a, b, c, d, e, f}},   // as stored
                           {3, 2, {c, b, a, f, e, d}},   // mirrored left-right
                           {3, 2, {f, e, d, c, b, a}},   // turned 180
                           {3, 2, {d, e, f, a, b, c}},   // mirrored top-bottom
                           {2, 3, {a, d, b, e, c, f}},   // transposed
                           {2, 3, {d, a, e, b, f, c}},   // turned 90 clockwise
                           {2, 3, {f, c, e, b, d, a}},   // transversed
                           {2, 3, {c, f, b, e, a, d}}};  // turned 90 counter-clockwise
  for (int o = 1; o <= 8; ++o) {
    CAPTURE(o);
    const bool big = o % 2 == 0;
    const fs::path png = dir / fmt::format("o{}.png", o);
    write_png_classic(png, 3, 2, PNG_COLOR_TYPE_GRAY, stored, {}, {}, exif_block(o, big, false));
    const DecodedImage p = read_image_file(png);
    CHECK(p.orientation == o);
    CHECK(p.width == want[o].w);
    CHECK(p.height == want[o].h);
    CHECK(p.pixels == want[o].px);
    const fs::path jpg = dir / fmt::format("o{}.jpg", o);
    write_jpeg(jpg, 3, 2, 1, stored, exif_block(o, big, true));
    const DecodedImage j = read_image_file(jpg);
    CHECK(j.orientation == o);
    REQUIRE(j.width == want[o].w);
    REQUIRE(j.height == want[o].h);
    for (size_t i = 0; i < j.pixels.size(); ++i)
      CHECK(std::abs(int{j.pixels[i]} - int{want[o].px[i]}) <= 8);  // within JPEG's loss
  }
  SUBCASE("RGB pixels move whole") {
    std::vector<uint8_t> rgb;
    for (uint8_t v : stored) rgb.insert(rgb.end(), {v, static_cast<uint8_t>(v + 1), 7});
    write_png_classic(dir / "rgb.png", 3, 2, PNG_COLOR_TYPE_RGB, rgb, {}, {},
                      exif_block(6, false, false));
    const DecodedImage p = read_image_file(dir / "rgb.png");
    REQUIRE(p.pixels.size() == 18);
    for (size_t i = 0; i < 6; ++i) {
      CHECK(p.pixels[i * 3] == want[6].px[i]);
      CHECK(p.pixels[i * 3 + 1] == want[6].px[i] + 1);
      CHECK(p.pixels[i * 3 + 2] == 7);
    }
  }
  SUBCASE("odd or damaged Exif leaves the pixels as stored") {
    std::string cut = exif_block(6, false, true);
    cut.resize(cut.size() - 14);  // the Orientation entry cut in half
    std::string nine = exif_block(9, true, true);
    std::string not_tiff = exif_block(6, false, true);
    not_tiff[6] = 'X';
    int n = 0;
    for (const std::string& block : {cut, nine, not_tiff, std::string("Exif\0\0", 6)}) {
      const fs::path jpg = dir / fmt::format("odd{}.jpg", n++);
      write_jpeg(jpg, 3, 2, 1, stored, block);
      const DecodedImage j = read_image_file(jpg);
      CHECK(j.orientation == 1);
      CHECK(j.width == 3);
    }
  }
}

TEST_CASE("damaged or unknown image files are refused, naming the file") {
  const fs::path dir = temp_dir();
  const std::vector<uint8_t> gray = pattern(8, 8, 1);
  write_png(dir / "ok.png", 8, 8, PNG_FORMAT_GRAY, gray.data());
  const std::string png = read_bytes(dir / "ok.png");
  write_bytes(dir / "cut.png", png.substr(0, png.size() / 2));
  std::vector<uint8_t> smooth(8 * 8, 100);
  write_jpeg(dir / "ok.jpg", 8, 8, 1, smooth);
  const std::string jpg = read_bytes(dir / "ok.jpg");
  write_bytes(dir / "cut.jpg", jpg.substr(0, 40));
  const std::vector<uint8_t> noise = pattern(64, 64, 3);
  write_jpeg(dir / "long.jpg", 64, 64, 3, noise);
  const std::string long_jpg = read_bytes(dir / "long.jpg");
  write_bytes(dir / "third.jpg", long_jpg.substr(0, long_jpg.size() / 3));  // header whole
  write_bytes(dir / "text.png", "not an image at all\n");
  write_bytes(dir / "short.pgm", "P5 4 4 255\nabc");
  write_bytes(dir / "big.pgm", "P2 1 1 10\n11\n");
  write_bytes(dir / "empty.ppm", "");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"cut.png", "PNG data unreadable"},
      {"cut.jpg", "JPEG data unreadable"},
      {"text.png", "not a PNG, JPEG, PGM"},
      {"short.pgm", "truncated"},
      {"big.pgm", "above maxval 10"},
      {"empty.ppm", "an empty file"},
      {"third.jpg", "JPEG data corrupt or truncated"},
      {"missing.png", "cannot open it"},
  };
  for (const auto& [name, says] : cases) {
    CAPTURE(name);
    const std::string e = error_of(dir / name);
    CHECK_MESSAGE(e.find((dir / name).string() + ": ") == 0, e);
    CHECK_MESSAGE(e.find(says) != std::string::npos, e);
  }
  fs::remove_all(dir);
}

TEST_CASE("an image becomes the model's channels and size") {
  DecodedImage img;
  img.width = 4;
  img.height = 2;
  img.channels = 1;
  img.pixels = {0, 51, 102, 153, 204, 255, 0, 51};
  // Same size: x / 255.
  std::vector<float> same = to_model_input(img, {1, 2, 4, 10});
  REQUIRE(same.size() == 8);
  for (size_t i = 0; i < 8; ++i) CHECK(same[i] == img.pixels[i] / 255.0f);
  // Gray to RGB: the plane three times.
  const std::vector<float> rgb = to_model_input(img, {3, 2, 4, 10});
  for (size_t i = 0; i < 8; ++i) {
    CHECK(rgb[i] == same[i]);
    CHECK(rgb[8 + i] == same[i]);
    CHECK(rgb[16 + i] == same[i]);
  }
  // A wide image to a square: the shorter side fits, the middle two columns are cut out.
  const std::vector<float> middle = to_model_input(img, {1, 2, 2, 10});
  CHECK(middle == std::vector<float>{same[1], same[2], same[5], same[6]});
  // Twice as large, each pixel a 2x2 block: area averaging gives the original back.
  DecodedImage big;
  big.width = 8;
  big.height = 4;
  big.channels = 1;
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 8; ++x)
      big.pixels.push_back(img.pixels[static_cast<size_t>((y / 2) * 4 + x / 2)]);
  CHECK(to_model_input(big, {1, 2, 4, 10}) == same);
  // RGB to gray by BT.601 luma.
  DecodedImage color;
  color.width = color.height = 1;
  color.channels = 3;
  color.pixels = {255, 0, 0};
  CHECK(to_model_input(color, {1, 1, 1, 10})[0] == doctest::Approx(0.299).epsilon(1e-6));
  // Growing: bilinear, a constant stays constant and a ramp stays within its ends.
  DecodedImage ramp;
  ramp.width = 2;
  ramp.height = 1;
  ramp.channels = 1;
  ramp.pixels = {0, 255};
  const std::vector<float> grown = to_model_input(ramp, {1, 4, 8, 10});
  for (int y = 0; y < 4; ++y) {
    CHECK(grown[static_cast<size_t>(y * 8)] == 0.0f);
    CHECK(grown[static_cast<size_t>(y * 8 + 7)] == 1.0f);
    for (int x = 1; x < 8; ++x)
      CHECK(grown[static_cast<size_t>(y * 8 + x)] >= grown[static_cast<size_t>(y * 8 + x - 1)]);
  }
}
