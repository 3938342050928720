// Test helper: writes an image folder (torchvision's ImageFolder layout) of binary PPM
// files for the image-folder dataset's tests: data and training alike. Header only, no
// test framework; the pixels follow a fixed generator, so every run writes the same bytes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace dtrain::test {

// A P6 file of `rgb` (width * height * 3 bytes, row-major).
inline void write_ppm(const std::filesystem::path& file, int width, int height,
                      const std::vector<uint8_t>& rgb) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  out << "P6\n" << width << ' ' << height << "\n255\n";
  out.write(reinterpret_cast<const char*>(rgb.data()), static_cast<std::streamsize>(rgb.size()));
}

// root/<split>/<class>/img<NNN>.ppm for each split (e.g. {"train", 8}, {"val", 3}) and
// class: sizes between 20 and 69 pixels a side, each image mostly its class's colour
// (class k: channel k % 3 high, in a shade by k / 3) with noise, so a small model learns
// them in a few steps.
struct SplitCount {
  std::string split;
  int per_class = 0;
};
inline void write_image_folder(const std::filesystem::path& root,
                               const std::vector<std::string>& classes,
                               const std::vector<SplitCount>& splits, uint32_t seed = 1) {
  uint32_t state = seed * 2654435761u + 1;
  const auto next = [&](uint32_t n) {  // a linear congruential draw in [0, n)
    state = state * 1664525u + 1013904223u;
    return (state >> 8) % n;
  };
  for (const SplitCount& s : splits) {
    for (size_t k = 0; k < classes.size(); ++k) {
      for (int i = 0; i < s.per_class; ++i) {
        const int w = 20 + static_cast<int>(next(50)), h = 20 + static_cast<int>(next(50));
        std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
        for (size_t p = 0; p < rgb.size(); ++p) {
          const bool high = p % 3 == k % 3;
          const int base = high ? 200 - 60 * static_cast<int>(k / 3) : 40;
          rgb[p] = static_cast<uint8_t>(std::clamp(base + static_cast<int>(next(81)) - 40, 0, 255));
        }
        char name[32];
        std::snprintf(name, sizeof name, "img%03d.ppm", i);
        write_ppm(root / s.split / classes[k] / name, w, h, rgb);
      }
    }
  }
}

}  // namespace dtrain::test
