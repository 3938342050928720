// Formatting of user errors (message + "hint:" line) and internal check failures.
#include "core/error.h"

namespace dtrain {

static std::string compose(const std::string& message, const std::string& hint) {
  if (hint.empty()) return message;
  return message + "\n  hint: " + hint;
}

Error::Error(std::string message, std::string hint)
    : std::runtime_error(compose(message, hint)),
      message_(std::move(message)),
      hint_(std::move(hint)) {}

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::string text = fmt::format("internal error at {}:{}: check `{}` failed", file, line, cond);
  if (!msg.empty()) text += ": " + msg;
  text += " (this is a dtrain bug; please report it)";
  throw InternalError(text);
}

}  // namespace dtrain
