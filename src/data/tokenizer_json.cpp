// Tokenizer files. dtrain's tokenizer.json (format "dtrain-bpe", version 1):
//   {"format": "dtrain-bpe", "version": 1, "pretokenizer": "words-v1",
//    "vocab_size": N,
//    "byte_ids": [256 ids: the token of byte 0, 1, ..., 255],
//    "merges": [[left, right, result], ...]            (rank order, first applies first),
//    "special_tokens": {"<|endoftext|>": id, "[PAD]": id, "[UNK]": id, "[CLS]": id,
//                       "[SEP]": id, "[MASK]": id}}
// Ids are explicit so the same file holds a trained vocabulary and GPT-2's. GPT-2's
// vocab.json + merges.txt are read here too. The vocabulary rules are checked by
// the Tokenizer constructor; this file checks the shape of the files.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "data/atomic_file.h"
#include "data/file_bytes.h"
#include "data/tokenizer.h"

namespace dtrain {
namespace {

using json = nlohmann::json;

constexpr const char* kFormat = "dtrain-bpe";
constexpr int kVersion = 1;
constexpr const char* kPretokenizer = "words-v1";
constexpr const char* kRebuild =
    "the file is damaged or not a dtrain tokenizer; rebuild it with `dtrain data tokenize`";

[[noreturn]] void bad_file(const std::string& path, const std::string& what,
                           const std::string& hint = kRebuild) {
  throw Error(fmt::format("{}: {}", path, what), hint);
}

json parse_json(const std::string& path, const std::string& missing_hint,
                const std::string& bad_hint = kRebuild) {
  const FileBytes f = read_file_bytes(path, missing_hint);
  try {
    return json::parse(f.bytes.begin(), f.bytes.end());
  } catch (const json::parse_error& e) {
    bad_file(path, fmt::format("not valid JSON (near byte {}): {}", e.byte, e.what()), bad_hint);
  }
}

const json& member(const json& root, const std::string& path, const char* key) {
  const auto it = root.find(key);
  if (it == root.end()) bad_file(path, fmt::format("missing field \"{}\"", key));
  return *it;
}

TokenId id_at(const json& v, const std::string& path, const std::string& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      v.get<int64_t>() > std::numeric_limits<int32_t>::max())
    bad_file(path,
             fmt::format("{}: expected a token id (an integer >= 0), got {}", where, v.dump()));
  return static_cast<TokenId>(v.get<int64_t>());
}

void check_header(const json& root, const std::string& path) {
  if (!root.is_object()) bad_file(path, "expected a JSON object at the top level");
  const json& format = member(root, path, "format");
  if (format != kFormat)
    bad_file(path, fmt::format("format {} is not \"{}\"", format.dump(), kFormat),
             "pass a tokenizer.json written by `dtrain data tokenize`; GPT-2's vocab.json goes "
             "with --vocab-json and --merges-txt");
  const json& version = member(root, path, "version");
  if (version != kVersion)
    bad_file(path,
             fmt::format("format version {} is not supported (this dtrain reads version {})",
                         version.dump(), kVersion),
             "rebuild the tokenizer with this dtrain's `dtrain data tokenize`");
  if (member(root, path, "pretokenizer") != kPretokenizer)
    bad_file(path, fmt::format("pretokenizer {} is not \"{}\"",
                               member(root, path, "pretokenizer").dump(), kPretokenizer));
}

TokenizerSpec read_spec(const json& root, const std::string& path) {
  TokenizerSpec spec;
  const json& n = member(root, path, "vocab_size");
  if (!n.is_number_integer()) bad_file(path, "vocab_size: expected an integer");
  spec.vocab_size = n.get<int64_t>();
  const json& bytes = member(root, path, "byte_ids");
  if (!bytes.is_array() || bytes.size() != 256)
    bad_file(path, "byte_ids: expected an array of 256 token ids");
  for (size_t b = 0; b < 256; ++b)
    spec.byte_ids[b] = id_at(bytes[b], path, fmt::format("byte_ids[{}]", b));
  const json& merges = member(root, path, "merges");
  if (!merges.is_array()) bad_file(path, "merges: expected an array of [left, right, result]");
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    const std::string where = fmt::format("merges[{}]", r);
    if (!m.is_array() || m.size() != 3)
      bad_file(path, fmt::format("{}: expected [left, right, result], got {}", where, m.dump()));
    spec.merges.push_back(
        {id_at(m[0], path, where), id_at(m[1], path, where), id_at(m[2], path, where)});
  }
  const json& specials = member(root, path, "special_tokens");
  if (!specials.is_object()) bad_file(path, "special_tokens: expected an object name -> id");
  for (const auto& [name, id] : specials.items()) {
    if (std::find(kSpecialNames.begin(), kSpecialNames.end(), name) == kSpecialNames.end())
      bad_file(path, fmt::format("special_tokens: unknown special token \"{}\"", name));
  }
  for (size_t s = 0; s < kSpecialNames.size(); ++s) {
    const auto it = specials.find(std::string(kSpecialNames[s]));
    if (it == specials.end())
      bad_file(path, fmt::format("special_tokens: \"{}\" is missing", kSpecialNames[s]));
    spec.special_ids[s] = id_at(*it, path, fmt::format("special_tokens[\"{}\"]", kSpecialNames[s]));
  }
  return spec;
}

}  // namespace

// One merge per line, so the file diffs and greps well.
void Tokenizer::save(const std::string& path) const {
  std::string out = fmt::format(
      "{{\n  \"format\": \"{}\",\n  \"version\": {},\n  \"pretokenizer\": \"{}\",\n"
      "  \"vocab_size\": {},\n  \"byte_ids\": {},\n  \"special_tokens\": {{",
      kFormat, kVersion, kPretokenizer, spec_.vocab_size, json(spec_.byte_ids).dump());
  for (size_t s = 0; s < kSpecialNames.size(); ++s)
    out += fmt::format("{}\"{}\": {}", s == 0 ? "" : ", ", kSpecialNames[s], spec_.special_ids[s]);
  out += "},\n  \"merges\": [";
  for (size_t r = 0; r < spec_.merges.size(); ++r) {
    const Merge& m = spec_.merges[r];
    out += fmt::format("{}\n    [{}, {}, {}]", r == 0 ? "" : ",", m.left, m.right, m.result);
  }
  out += "\n  ]\n}\n";
  write_file_atomic(path, {out});
}

Tokenizer Tokenizer::load(const std::string& path) {
  const json root =
      parse_json(path, "run `dtrain data tokenize --out DIR` first; it writes DIR/tokenizer.json");
  check_header(root, path);
  return Tokenizer(read_spec(root, path), path);
}

// ---- GPT-2 ------------------------------------------------------------------------

namespace {

// GPT-2's bytes_to_unicode(): the printable bytes ! .. ~, ¡ .. ¬, ® .. ÿ map to
// themselves; the other 68 take the code points 256, 257, ... in byte order.
std::array<uint32_t, 256> gpt2_code_points() {
  std::array<uint32_t, 256> cp{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    cp[b] = printable ? b : next++;
  }
  return cp;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // GPT-2's table stays below U+0800
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return s;
}

// The bytes a vocab.json key stands for; false if it holds a character outside the table.
bool gpt2_key_bytes(const std::string& key, std::string& out) {
  static const std::unordered_map<std::string, char> inverse = [] {
    std::unordered_map<std::string, char> m;
    for (int b = 0; b < 256; ++b)
      m[gpt2_byte_to_unicode(static_cast<uint8_t>(b))] = static_cast<char>(b);
    return m;
  }();
  out.clear();
  for (size_t i = 0; i < key.size();) {
    const auto lead = static_cast<uint8_t>(key[i]);
    const size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : 0;
    if (len == 0 || i + len > key.size()) return false;
    const auto it = inverse.find(key.substr(i, len));
    if (it == inverse.end()) return false;
    out += it->second;
    i += len;
  }
  return true;
}

struct Gpt2Vocab {
  TokenizerSpec spec;
  std::unordered_map<std::string, TokenId> id_of;  // vocab.json key -> id
};

Gpt2Vocab read_gpt2_vocab(const std::string& path) {
  const char* hint = "expected GPT-2's vocab.json: an object mapping token strings to ids";
  const json root = parse_json(path, "pass GPT-2's vocab.json (from the model's files)", hint);
  if (!root.is_object()) bad_file(path, "expected a JSON object of token -> id", hint);
  Gpt2Vocab v;
  std::vector<bool> seen(root.size(), false);
  std::array<bool, 256> have_byte{};
  std::array<bool, kNumSpecials> have_special{};
  std::string bytes;
  for (const auto& [key, value] : root.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= static_cast<int64_t>(root.size()))
      bad_file(path,
               fmt::format("token {}: id {} is not in [0, {}) (ids must be dense)",
                           json(key).dump(), value.dump(), root.size()),
               hint);
    const auto id = static_cast<TokenId>(value.get<int64_t>());
    if (seen[static_cast<size_t>(id)])
      bad_file(path, fmt::format("token {}: id {} is used twice", json(key).dump(), id), hint);
    seen[static_cast<size_t>(id)] = true;
    v.id_of[key] = id;
    const auto special = std::find(kSpecialNames.begin(), kSpecialNames.end(), key);
    if (special != kSpecialNames.end()) {
      const auto s = static_cast<size_t>(special - kSpecialNames.begin());
      v.spec.special_ids[s] = id;
      have_special[s] = true;
    } else if (!gpt2_key_bytes(key, bytes)) {
      bad_file(path,
               fmt::format("token {} (id {}) holds a character outside GPT-2's "
                           "byte-to-unicode table",
                           json(key).dump(), id),
               hint);
    } else if (bytes.size() == 1) {
      v.spec.byte_ids[static_cast<uint8_t>(bytes[0])] = id;
      have_byte[static_cast<uint8_t>(bytes[0])] = true;
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (!have_byte[static_cast<size_t>(b)])
      bad_file(path,
               fmt::format("no token for byte 0x{:02x} ({})", b,
                           json(gpt2_byte_to_unicode(static_cast<uint8_t>(b))).dump()),
               hint);
  }
  auto next = static_cast<TokenId>(root.size());
  for (size_t s = 0; s < kNumSpecials; ++s) {
    if (!have_special[s]) v.spec.special_ids[s] = next++;
  }
  v.spec.vocab_size = next;
  return v;
}

void read_gpt2_merges(const std::string& path, const std::string& vocab_path, Gpt2Vocab& v) {
  const FileBytes f = read_file_bytes(path, "pass GPT-2's merges.txt (from the model's files)");
  for_each_line(f.text(), [&](std::string_view text, int64_t line_no) {
    const std::string line(text);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) return;
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      bad_file(fmt::format("{}:{}", path, line_no),
               fmt::format("expected two tokens separated by one space, got {}", json(line).dump()),
               "merges.txt holds a #version line, then one \"left right\" pair per line");
    const std::string left = line.substr(0, space), right = line.substr(space + 1);
    for (const std::string& key : {left, right, left + right}) {
      if (v.id_of.find(key) == v.id_of.end())
        bad_file(fmt::format("{}:{}", path, line_no),
                 fmt::format("token {} is not in {}", json(key).dump(), vocab_path),
                 "vocab.json and merges.txt must come from the same model");
    }
    v.spec.merges.push_back({v.id_of[left], v.id_of[right], v.id_of[left + right]});
  });
}

}  // namespace

std::string gpt2_byte_to_unicode(uint8_t b) {
  static const std::array<uint32_t, 256> cp = gpt2_code_points();
  return utf8(cp[b]);
}

Tokenizer Tokenizer::load_gpt2(const std::string& vocab_json, const std::string& merges_txt) {
  Gpt2Vocab v = read_gpt2_vocab(vocab_json);
  read_gpt2_merges(merges_txt, vocab_json, v);
  return Tokenizer(std::move(v.spec), vocab_json + " with " + merges_txt);
}

}  // namespace dtrain
