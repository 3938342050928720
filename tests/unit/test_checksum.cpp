// CRC-32C against the standard check value and RFC 3720's test vectors, and
// the incremental form against the one-shot form.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/checksum.h"

using dtrain::crc32c;

TEST_CASE("crc32c known answers") {
  const std::string check = "123456789";
  CHECK(crc32c(check.data(), check.size()) == 0xE3069283u);
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff), inc(32), dec(32);
  for (int i = 0; i < 32; ++i) {
    inc[i] = static_cast<unsigned char>(i);
    dec[i] = static_cast<unsigned char>(31 - i);
  }
  CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);  // RFC 3720 B.4
  CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(crc32c(inc.data(), 32) == 0x46DD794Eu);
  CHECK(crc32c(dec.data(), 32) == 0x113FDB5Cu);
  CHECK(crc32c(nullptr, 0) == 0u);
}

TEST_CASE("crc32c continues across split buffers") {
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 7 + 3);
  const uint32_t whole = crc32c(data.data(), data.size());
  for (size_t cut : {0u, 1u, 7u, 8u, 9u, 500u, 999u}) {
    const uint32_t part = crc32c(data.data() + cut, data.size() - cut, crc32c(data.data(), cut));
    CHECK(part == whole);
  }
  data[123] ^= 0x10;
  CHECK(crc32c(data.data(), data.size()) != whole);
}
