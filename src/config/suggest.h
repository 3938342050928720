// "Did you mean" for unknown keys and enum values: the closest candidate by
// edit distance (adjacent swaps count one), if it is close enough to be a typo.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::config {

size_t edit_distance(std::string_view a, std::string_view b);

std::optional<std::string> closest(std::string_view word,
                                   const std::vector<std::string>& candidates);

// " (did you mean "x"?)" or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace dtrain::config
