// Unit tests of the document layer: byte checks, the nesting pre-scan, duplicate
// keys, positions, and the did-you-mean distance. No schema involved.
#include <doctest/doctest.h>

#include <string>

#include "config/suggest.h"
#include "config/tree.h"
#include "core/error.h"

using namespace dtrain;
using namespace dtrain::config;

namespace {

std::string error_of(auto&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("edit distance counts insertions, deletions, substitutions and swaps") {
  CHECK(edit_distance("optimizer", "optimizer") == 0);
  CHECK(edit_distance("optimiser", "optimizer") == 1);
  CHECK(edit_distance("lr", "rl") == 1);
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("steps", "epochs") > 2);
  CHECK(did_you_mean("optimiser", {"run", "optimizer", "train"}) ==
        " (did you mean \"optimizer\"?)");
  CHECK(did_you_mean("adam", {"sgd", "adamw", "lamb"}) == " (did you mean \"adamw\"?)");
  CHECK(did_you_mean("zzzzzz", {"sgd", "adamw", "lamb"}).empty());
}

TEST_CASE("positions are 1-based line:column of the value") {
  ConfigNode root = parse_yaml("a: 1\nb:\n  c: hello\n", "f.yaml");
  REQUIRE(root.kind == ConfigNode::Kind::map);
  const Entry* b = root.find("b");
  REQUIRE(b != nullptr);
  CHECK(b->key_loc.str() == "f.yaml:2:1");
  const Entry* c = b->value.find("c");
  REQUIRE(c != nullptr);
  CHECK(c->value.loc.str() == "f.yaml:3:6");
  CHECK(c->value.text == "hello");
  CHECK_FALSE(c->value.quoted);
  CHECK(parse_yaml("a: \"1\"\n", "f").find("a")->value.quoted);
}

TEST_CASE("duplicate keys name both positions") {
  const std::string msg = error_of([] { parse_yaml("x:\n  a: 1\n  b: 2\n  a: 3\n", "d.yaml"); });
  CHECK(msg.find("d.yaml:4:3: x: duplicate key \"a\" (first at line 2, column 3)") == 0);
  CHECK(error_of([] { parse_yaml("a: 1\na: 1\n", "d.yaml"); }).find("d.yaml:2:1: duplicate key") ==
        0);
  // A --set value has no positions: no "line 0, column 0".
  const std::string set = error_of([] { parse_yaml("{data: 1, data: 1}", "--set p=...", false); });
  CHECK(set.find("duplicate key \"data\" (given twice in one value)") != std::string::npos);
  CHECK(set.find("line 0") == std::string::npos);
}

TEST_CASE("bytes: NUL, invalid UTF-8, control characters are refused with a position") {
  CHECK(error_of([] {
          check_bytes(std::string("a: 1\nb: \0", 10), "f");
        }).find("f:2:4: NUL byte") == 0);
  CHECK(error_of([] { check_bytes("a: \xc3\x28", "f"); }).find("f:1:4: invalid UTF-8") == 0);
  CHECK(error_of([] { check_bytes("a: \xed\xa0\x80", "f"); }).find("invalid UTF-8") !=
        std::string::npos);
  CHECK(error_of([] { check_bytes("a: \x01", "f"); }).find("control character 0x01") !=
        std::string::npos);
  CHECK_NOTHROW(check_bytes("name: caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x9a\x80\r\n\tx", "f"));
}

TEST_CASE("nesting: deep flow or block input is refused before yaml-cpp parses it") {
  const std::string flow = "a: " + std::string(100000, '[') + std::string(100000, ']');
  CHECK(error_of([&] { parse_yaml(flow, "f"); }).find("nesting deeper than 32 levels") !=
        std::string::npos);
  std::string block;
  for (int i = 0; i < 50; ++i) block += std::string(2 * i, ' ') + "k:\n";
  CHECK(error_of([&] { parse_yaml(block, "f"); }).find("nesting deeper than 32 levels") !=
        std::string::npos);
  std::string dashes;
  for (int i = 0; i < 50; ++i) dashes += "- ";
  CHECK(error_of([&] { parse_yaml(dashes + "x", "f"); }).find("nesting deeper") !=
        std::string::npos);
  // Brackets inside quotes, comments and block scalars do not count.
  const std::string quoted =
      "a: \"" + std::string(100, '[') + "\"  # " + std::string(100, '{') + "\n";
  CHECK_NOTHROW(parse_yaml(quoted, "f"));
  std::string text = "a: |\n";
  for (int i = 0; i < 50; ++i) text += std::string(2 + i, ' ') + "line\n";
  CHECK_NOTHROW(parse_yaml(text, "f"));
}

TEST_CASE("nesting: 33 levels that pass the pre-scan are caught after parsing") {
  const std::string flow = "a: " + std::string(34, '[') + std::string(34, ']');
  CHECK(error_of([&] { parse_yaml(flow, "f"); }).find("nesting deeper than 32 levels") !=
        std::string::npos);
  const std::string ok = "a: " + std::string(30, '[') + std::string(30, ']');
  CHECK_NOTHROW(parse_yaml(ok, "f"));
}

TEST_CASE("syntax errors carry yaml-cpp's position") {
  CHECK(error_of([] {
          parse_yaml("a: [1, 2\n", "s.yaml");
        }).find("s.yaml:2:1: YAML syntax error") == 0);
  CHECK(error_of([] {
          parse_yaml("a: 1\n---\nb: 2\n", "m.yaml");
        }).find("expected one YAML document, found a second") != std::string::npos);
}

TEST_CASE("alias expansion is bounded") {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 0; i < 8; ++i) {
    const char prev = static_cast<char>('a' + i), cur = static_cast<char>('b' + i);
    bomb += fmt::format("{0}: &{0} [*{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}]\n",
                        cur, prev);
  }
  CHECK(error_of([&] { parse_yaml(bomb, "b"); }).find("YAML nodes") != std::string::npos);
}
