// JSON reports from field tables: a report's fields are listed once, as (key, member) or (key,
// function) rows, instead of being written key by key at every place that renders the struct.
// The table's order is the key order of the output (nlohmann::ordered_json), so a rendering
// moved onto a table keeps its bytes. The pattern manager/metrics.cc uses for its metric families.
//
//   static const JsonFields<RankReport> kRank = {
//       {"dir", &RankReport::dir},
//       {"blocks", &RankReport::blocks},
//       {"groups", [](const RankReport& r) { return GroupsJson(r); }},
//   };
//   nlohmann::ordered_json j = kRank.ToJson(rank);
//
// For reports and command output, not hot paths: each row is a std::function call.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace kvo {

template <typename T>
class JsonFields {
 public:
  using Json = nlohmann::ordered_json;

  struct Field {
    // A data member, converted as nlohmann converts its type.
    template <typename M>
    Field(const char* name, M T::*member)  // NOLINT(google-explicit-constructor)
        : key(name), get([member](const T& v) { return Json(v.*member); }) {}
    // A computed value; one of type std::optional is left out of the object when empty (a
    // key that only some values have, at its place in the order).
    template <typename F, typename = std::enable_if_t<std::is_invocable_v<const F&, const T&>>>
    Field(const char* name, F f)  // NOLINT(google-explicit-constructor)
        : key(name), get([f = std::move(f)](const T& v) { return ToJson(f(v)); }) {}

    std::string key;
    std::function<Json(const T&)> get;

   private:
    template <typename V>
    static Json ToJson(V&& value) {
      return Json(std::forward<V>(value));
    }
    template <typename V>
    static Json ToJson(std::optional<V> value) {
      return value ? Json(*std::move(value)) : Json(Json::value_t::discarded);
    }
  };

  JsonFields(std::initializer_list<Field> fields) : fields_(fields) {}

  // Sets every field of `value` in `out` (an object, or null: becomes one), in table order.
  void AppendTo(const T& value, Json* out) const {
    for (const Field& f : fields_) {
      Json v = f.get(value);
      if (!v.is_discarded()) (*out)[f.key] = std::move(v);
    }
  }
  Json ToJson(const T& value) const {
    Json out = Json::object();
    AppendTo(value, &out);
    return out;
  }
  // An array of ToJson(element).
  template <typename Range>
  Json ArrayOf(const Range& values) const {
    Json out = Json::array();
    for (const T& v : values) out.push_back(ToJson(v));
    return out;
  }

 private:
  std::vector<Field> fields_;
};

}  // namespace kvo
