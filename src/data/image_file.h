// Image files for `dtrain predict` on an image model and the image-folder dataset: PNG (libpng),
// JPEG (libjpeg) and the netpbm formats (PGM, PPM: P2, P3, P5, P6), decoded to 8-bit gray or RGB
// (an alpha channel is composited onto black, v * alpha / 255, the background of the datasets
// dtrain trains on; 16-bit PNG samples keep their high byte and no gamma is applied, as PIL and
// torchvision read them; netpbm samples scale by their maxval; a JPEG with corrupt or
// truncated data and an image over 178,956,970 pixels (Pillow's limit) are refused; a CMYK or YCCK
// JPEG becomes RGB as Pillow converts it, its values taken as stored inverted), then made the
// model's input: its channel count (gray repeated to RGB, RGB to gray by ITU-R BT.601 luma) and its
// size, the shorter side scaled to it and the middle cut out (torchvision's Resize then
// CenterCrop), by area averaging when shrinking and bilinear interpolation when growing. A JPEG's
// or PNG's Exif orientation is applied first, as a photo viewer shows it (PIL's exif_transpose).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace dtrain {

struct DecodedImage {
  int width = 0, height = 0, channels = 0;  // channels: 1 (gray) or 3 (RGB)
  std::vector<uint8_t> pixels;              // [height, width, channels], row-major
  std::string format;                       // "png", "jpeg", "pgm", "ppm"
  int orientation = 1;  // the file's Exif orientation (1-8); the pixels are already upright
};

// The file's format is known by its first bytes, not its name. An unreadable, truncated
// or unknown file is an Error naming it.
DecodedImage read_image_file(const std::filesystem::path& file);

// Whether `file`'s name ends in an image extension read_image_file knows (.png, .jpg,
// .jpeg, .pgm, .ppm, .pnm; any case): what a directory given to predict contributes.
bool is_image_file_name(const std::filesystem::path& file);

// The image as the model's input: [C, H, W] floats in [0, 1] (pixel / 255), C, H and W
// from `g`. center_crop in (0, 1]: the shorter side is scaled to g's / center_crop before
// the middle is cut out (torchvision's Resize(size / center_crop) then CenterCrop(size)).
std::vector<float> to_model_input(const DecodedImage& image, const ImageGeometry& g,
                                  double center_crop = 1.0);

// The image's region `box` (inside it) scaled to g's size, each axis on its own, as the
// model's input (torchvision's resized_crop: the crop, then the resize, which reads no
// pixel outside the box).
std::vector<float> box_to_model_input(const DecodedImage& image, const ImageGeometry& g,
                                      const ImageBox& box);

}  // namespace dtrain
