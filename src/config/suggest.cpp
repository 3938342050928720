// Optimal-string-alignment edit distance and the typo threshold for suggestions.
#include "config/suggest.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace dtrain::config {

size_t edit_distance(std::string_view a, std::string_view b) {
  // d[i][j] = distance between a[0, i) and b[0, j), kept as three rolling rows.
  std::vector<size_t> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                                  std::tolower(static_cast<unsigned char>(b[j - 1]))
                              ? 0
                              : 1;
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::optional<std::string> closest(std::string_view word,
                                   const std::vector<std::string>& candidates) {
  if (word.size() > 64) return std::nullopt;  // not a typo; and keeps the cost bounded
  const size_t limit = std::max<size_t>(1, std::min<size_t>(3, word.size() / 3));
  std::optional<std::string> best;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    // A prefix ("adam" for "adamw", "cuda" for "cuda:0") is a likely slip too.
    if (d > limit && word.size() >= 3 && c.starts_with(word)) d = limit;
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  auto best = closest(word, candidates);
  return best ? fmt::format(" (did you mean \"{}\"?)", *best) : std::string();
}

}  // namespace dtrain::config
