// kvo demo's report: text for a terminal, one JSON object, and a hand-written SVG (no
// dependencies: a few paths and rectangles are simpler than any plotting library).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "common/json_fields.h"
#include "demo/demo.h"

namespace kvo::demo {
namespace {

using OJson = nlohmann::ordered_json;

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return Fmt(u == 0 ? "%.0f" : "%.1f", b) + " " + units[u];
}

std::string Rate(double bytes, double seconds) {
  if (seconds <= 0 || bytes <= 0) return "-";
  return Bytes(bytes / seconds) + "/s";
}

std::string Pct(double x) { return Fmt("%.1f %%", 100 * x); }

std::string Count(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(i, ",");
  return s;
}

const PolicyRun* Find(const DemoReport& r, const std::string& policy) {
  for (const PolicyRun& p : r.runs) {
    if (p.policy == policy) return &p;
  }
  return nullptr;
}

double SafeDiv(double a, double b) { return b != 0 ? a / b : 0; }

OJson TiersJson(const Tiers& t, bool with_gpu) {
  OJson o;
  if (with_gpu) o["GPU"] = t.gpu;
  o["CPU"] = t.cpu;
  o["DISK"] = t.disk;
  return o;
}

OJson PctJson(const Percentiles& p) {
  return OJson{{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}};
}

const char* Color(size_t i) {
  static const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"};
  return kColors[i % 5];
}

std::string Esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '<') {
      o += "&lt;";
    } else if (c == '>') {
      o += "&gt;";
    } else if (c == '&') {
      o += "&amp;";
    } else if (c == '"') {
      o += "&quot;";
    } else {
      o += c;
    }
  }
  return o;
}

}  // namespace

std::string RenderText(const DemoReport& r) {
  std::ostringstream out;
  out << "kvo demo: " << r.instances << " engine(s) (kvo sim) + indexer (kvo index serve) + "
      << "router (kvo route), driven by kvo load\n"
      << "workload: " << r.workload << "\n\n";
  const int w0 = 40, w = 24;
  auto row = [&](const std::string& label, auto cell) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "%-*s", w0, label.c_str());
    out << buf;
    for (const PolicyRun& p : r.runs) {
      std::snprintf(buf, sizeof buf, "%-*s", w, cell(p).c_str());
      out << buf;
    }
    out << "\n";
  };
  row("policy", [](const PolicyRun& p) { return p.policy; });
  row("requests (errors)",
      [](const PolicyRun& p) { return Count(p.requests) + " (" + Count(p.errors) + ")"; });
  row("prompt tokens", [](const PolicyRun& p) { return Count(p.prompt_tokens); });
  row("hit tokens GPU / CPU / file", [](const PolicyRun& p) {
    return Count(p.hit_tokens.gpu) + " / " + Count(p.hit_tokens.cpu) + " / " +
           Count(p.hit_tokens.disk);
  });
  row("prefix hit rate", [](const PolicyRun& p) { return Pct(p.hit_rate()); });
  row("prefill tokens saved / computed", [](const PolicyRun& p) {
    return Count(p.hit_tokens.total()) + " / " + Count(p.prefill_computed);
  });
  row("bytes to GPU from CPU / file", [](const PolicyRun& p) {
    return Bytes(static_cast<double>(p.bytes_loaded.cpu)) + " / " +
           Bytes(static_cast<double>(p.bytes_loaded.disk));
  });
  row("  load bandwidth", [](const PolicyRun& p) {
    return Rate(static_cast<double>(p.bytes_loaded.total()), p.load_seconds);
  });
  row("bytes from GPU to CPU / file", [](const PolicyRun& p) {
    return Bytes(static_cast<double>(p.bytes_stored.cpu)) + " / " +
           Bytes(static_cast<double>(p.bytes_stored.disk));
  });
  row("  store bandwidth", [](const PolicyRun& p) {
    return Rate(static_cast<double>(p.bytes_stored.total()), p.store_seconds);
  });
  row("events published / indexed", [](const PolicyRun& p) {
    return Count(p.events_published) + " / " + Count(p.events_indexed);
  });
  row("blocks verified (mismatches)", [](const PolicyRun& p) {
    return Count(p.blocks_verified) + " (" + Count(p.mismatches) + ")";
  });
  row("TTFT p50 / p90 / p99 (ms)", [](const PolicyRun& p) {
    return Fmt("%.1f", p.ttft_ms.p50) + " / " + Fmt("%.1f", p.ttft_ms.p90) + " / " +
           Fmt("%.1f", p.ttft_ms.p99);
  });
  row("end-to-end p50 / p99 (ms)", [](const PolicyRun& p) {
    return Fmt("%.1f", p.e2e_ms.p50) + " / " + Fmt("%.1f", p.e2e_ms.p99);
  });
  row("router hit tokens predicted / delivered", [](const PolicyRun& p) {
    return Count(p.predicted_hit_tokens) + " / " + Count(p.delivered_hit_tokens);
  });
  row("wall time (s)", [](const PolicyRun& p) { return Fmt("%.1f", p.wall_s); });
  row("index equals every engine",
      [](const PolicyRun& p) { return std::string(p.consistent ? "yes" : "NO"); });
  out << "\n";
  const PolicyRun* kv = Find(r, "kv");
  const PolicyRun* rr = Find(r, "round-robin");
  if (kv != nullptr && rr != nullptr) {
    out << "kv vs round-robin: prefix hit rate " << Pct(kv->hit_rate()) << " vs "
        << Pct(rr->hit_rate()) << " (" << Fmt("%.2fx", SafeDiv(kv->hit_rate(), rr->hit_rate()))
        << "), TTFT p50 " << Fmt("%.1f", kv->ttft_ms.p50) << " vs " << Fmt("%.1f", rr->ttft_ms.p50)
        << " ms (" << Fmt("%.2fx", SafeDiv(kv->ttft_ms.p50, rr->ttft_ms.p50)) << "; "
        << Fmt("%.2fx", SafeDiv(rr->ttft_ms.p50, kv->ttft_ms.p50)) << " faster), prefill tokens "
        << "computed " << Count(kv->prefill_computed) << " vs " << Count(rr->prefill_computed)
        << "\n";
  }
  for (const PolicyRun& p : r.runs) {
    if (!p.consistent) out << "[" << p.policy << "] inconsistent: " << p.inconsistency << "\n";
  }
  size_t checks = 0;
  for (const PolicyRun& p : r.runs) checks += p.checks.size();
  out << "verdict: " << r.mismatches() << " mismatches in " << Count([&] {
    int64_t v = 0;
    for (const PolicyRun& p : r.runs) v += p.blocks_verified;
    return v;
  }()) << " blocks verified byte for byte; index "
      << (r.consistent() ? "CONSISTENT" : "INCONSISTENT") << " (" << checks
      << " instance x medium block sets compared after each run quiesced)\n"
      << "total wall time " << Fmt("%.1f", r.wall_s) << " s\n";
  return out.str();
}

namespace {

const JsonFields<MediumCheck>& CheckFields() {
  static const JsonFields<MediumCheck> fields = {
      {"instance", &MediumCheck::instance},
      {"medium", &MediumCheck::medium},
      {"engine_blocks", &MediumCheck::engine_blocks},
      {"index_blocks", &MediumCheck::index_blocks},
      {"only_engine", &MediumCheck::only_engine},
      {"only_index", &MediumCheck::only_index},
      {"engine_digest", &MediumCheck::engine_digest},
      {"index_digest", &MediumCheck::index_digest},
      {"equal", [](const MediumCheck& c) { return c.equal(); }},
  };
  return fields;
}

// One policy run in --json (demo/DESIGN.md).
const JsonFields<PolicyRun>& PolicyFields() {
  using P = PolicyRun;
  static const JsonFields<PolicyRun> fields = {
      {"requests", &P::requests},
      {"errors", &P::errors},
      {"engine_requests", &P::engine_requests},
      {"prompt_tokens", &P::prompt_tokens},
      {"hit_tokens", [](const P& p) { return TiersJson(p.hit_tokens, true); }},
      {"hit_rate", [](const P& p) { return p.hit_rate(); }},
      {"prefill_tokens_saved", [](const P& p) { return p.hit_tokens.total(); }},
      {"prefill_tokens_computed", &P::prefill_computed},
      {"bytes_loaded", [](const P& p) { return TiersJson(p.bytes_loaded, false); }},
      {"bytes_stored", [](const P& p) { return TiersJson(p.bytes_stored, false); }},
      {"load_bytes_per_s",
       [](const P& p) {
         return SafeDiv(static_cast<double>(p.bytes_loaded.total()), p.load_seconds);
       }},
      {"store_bytes_per_s",
       [](const P& p) {
         return SafeDiv(static_cast<double>(p.bytes_stored.total()), p.store_seconds);
       }},
      {"events_published", &P::events_published},
      {"events_indexed", &P::events_indexed},
      {"batches_indexed", &P::batches_indexed},
      {"blocks_verified", &P::blocks_verified},
      {"mismatches", &P::mismatches},
      {"ttft_ms", [](const P& p) { return PctJson(p.ttft_ms); }},
      {"e2e_ms", [](const P& p) { return PctJson(p.e2e_ms); }},
      {"router",
       [](const P& p) {
         return OJson{{"predicted_hit_tokens", p.predicted_hit_tokens},
                      {"delivered_hit_tokens", p.delivered_hit_tokens},
                      {"stats", p.router_stats}};
       }},
      {"wall_s", &P::wall_s},
      {"load_wall_s", &P::load_wall_s},
      {"consistent", &P::consistent},
      {"inconsistency", &P::inconsistency},
      {"checks", [](const P& p) { return CheckFields().ArrayOf(p.checks); }},
      {"dir", &P::dir},
  };
  return fields;
}

}  // namespace

OJson RenderJson(const DemoReport& r) {
  OJson o;
  o["mismatches"] = r.mismatches();
  o["consistent"] = r.consistent();
  o["instances"] = r.instances;
  o["workload"] = r.workload;
  o["wall_s"] = r.wall_s;
  OJson policies = OJson::object();
  for (const PolicyRun& p : r.runs) policies[p.policy] = PolicyFields().ToJson(p);
  o["policies"] = std::move(policies);
  const PolicyRun* kv = Find(r, "kv");
  const PolicyRun* rr = Find(r, "round-robin");
  if (kv != nullptr && rr != nullptr) {
    o["ratio"] =
        OJson{{"baseline", "round-robin"},
              {"hit_rate", SafeDiv(kv->hit_rate(), rr->hit_rate())},
              {"ttft_p50", SafeDiv(kv->ttft_ms.p50, rr->ttft_ms.p50)},
              {"ttft_p50_speedup", SafeDiv(rr->ttft_ms.p50, kv->ttft_ms.p50)},
              {"prefill_tokens_computed", SafeDiv(static_cast<double>(kv->prefill_computed),
                                                  static_cast<double>(rr->prefill_computed))}};
  }
  return o;
}

std::string RenderSvg(const DemoReport& r) {
  const double W = 980, H = 440;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" viewBox=\"0 0 " << W << " " << H << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"20\" y=\"24\" font-size=\"15\" font-weight=\"bold\">kvo demo: " << r.instances
    << " engines, " << Esc(r.workload) << "</text>\n";

  // Left: TTFT CDF per policy, log-scale x.
  const double L = 60, T = 60, PW = 480, PH = 320;
  double lo = 1e300, hi = 0;
  for (const PolicyRun& p : r.runs) {
    for (double v : p.ttft_samples) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  }
  s << "<text x=\"" << L << "\" y=\"" << T - 12 << "\" font-weight=\"bold\">TTFT distribution "
    << "(fraction of requests with TTFT &lt;= x)</text>\n";
  s << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << PW << "\" height=\"" << PH
    << "\" fill=\"none\" stroke=\"#888\"/>\n";
  if (hi > 0) {
    const double llo = std::floor(std::log10(std::max(lo, 1e-3)));
    const double lhi = std::max(llo + 1, std::ceil(std::log10(hi)));
    auto X = [&](double v) { return L + PW * (std::log10(std::max(v, 1e-3)) - llo) / (lhi - llo); };
    auto Y = [&](double f) { return T + PH * (1 - f); };
    for (double e = llo; e <= lhi; e += 1) {
      const double x = L + PW * (e - llo) / (lhi - llo);
      s << "<line x1=\"" << x << "\" y1=\"" << T << "\" x2=\"" << x << "\" y2=\"" << T + PH
        << "\" stroke=\"#eee\"/><text x=\"" << x << "\" y=\"" << T + PH + 16
        << "\" text-anchor=\"middle\">" << Fmt("%g", std::pow(10, e)) << "</text>\n";
    }
    for (int q = 0; q <= 4; ++q) {
      const double y = Y(q / 4.0);
      s << "<line x1=\"" << L << "\" y1=\"" << y << "\" x2=\"" << L + PW << "\" y2=\"" << y
        << "\" stroke=\"#eee\"/><text x=\"" << L - 6 << "\" y=\"" << y + 4
        << "\" text-anchor=\"end\">" << q * 25 << "%</text>\n";
    }
    s << "<text x=\"" << L + PW / 2 << "\" y=\"" << T + PH + 34
      << "\" text-anchor=\"middle\">TTFT (ms, log scale)</text>\n";
    for (size_t i = 0; i < r.runs.size(); ++i) {
      std::vector<double> v = r.runs[i].ttft_samples;
      if (v.empty()) continue;
      std::sort(v.begin(), v.end());
      s << "<path fill=\"none\" stroke=\"" << Color(i) << "\" stroke-width=\"2\" d=\"M" << X(v[0])
        << "," << Y(0);
      for (size_t k = 0; k < v.size(); ++k) {
        s << " L" << X(v[k]) << "," << Y(static_cast<double>(k) / v.size()) << " L" << X(v[k])
          << "," << Y(static_cast<double>(k + 1) / v.size());
      }
      s << "\"/>\n";
      const double p50 = r.runs[i].ttft_ms.p50;
      s << "<line x1=\"" << X(p50) << "\" y1=\"" << Y(0.5) - 6 << "\" x2=\"" << X(p50) << "\" y2=\""
        << Y(0.5) + 6 << "\" stroke=\"" << Color(i) << "\" stroke-width=\"2\"/>\n";
      s << "<rect x=\"" << L + 10 << "\" y=\"" << T + 10 + 18 * i
        << "\" width=\"12\" height=\"12\" fill=\"" << Color(i) << "\"/><text x=\"" << L + 28
        << "\" y=\"" << T + 21 + 18 * i << "\">" << Esc(r.runs[i].policy) << ": p50 "
        << Fmt("%.1f", r.runs[i].ttft_ms.p50) << " ms, p99 " << Fmt("%.1f", r.runs[i].ttft_ms.p99)
        << " ms (" << v.size() << " requests)</text>\n";
    }
  } else {
    s << "<text x=\"" << L + PW / 2 << "\" y=\"" << T + PH / 2
      << "\" text-anchor=\"middle\">no per-request records</text>\n";
  }

  // Right: hit rate per tier, one stacked bar per policy.
  const double L2 = 640, PW2 = 300;
  s << "<text x=\"" << L2 << "\" y=\"" << T - 12 << "\" font-weight=\"bold\">Prefix hit rate "
    << "per tier (share of prompt tokens)</text>\n";
  s << "<rect x=\"" << L2 << "\" y=\"" << T << "\" width=\"" << PW2 << "\" height=\"" << PH
    << "\" fill=\"none\" stroke=\"#888\"/>\n";
  for (int q = 0; q <= 4; ++q) {
    const double y = T + PH * (1 - q / 4.0);
    s << "<line x1=\"" << L2 << "\" y1=\"" << y << "\" x2=\"" << L2 + PW2 << "\" y2=\"" << y
      << "\" stroke=\"#eee\"/><text x=\"" << L2 - 6 << "\" y=\"" << y + 4
      << "\" text-anchor=\"end\">" << q * 25 << "%</text>\n";
  }
  const char* tier_color[] = {"#2e7d32", "#81c784", "#c8e6c9"};
  const char* tier_name[] = {"GPU", "CPU", "file"};
  const double n = static_cast<double>(std::max<size_t>(r.runs.size(), 1));
  const double slot = PW2 / n, bw = std::min(80.0, slot * 0.6);
  for (size_t i = 0; i < r.runs.size(); ++i) {
    const PolicyRun& p = r.runs[i];
    const double pt = static_cast<double>(std::max<int64_t>(p.prompt_tokens, 1));
    const double parts[] = {p.hit_tokens.gpu / pt, p.hit_tokens.cpu / pt, p.hit_tokens.disk / pt};
    const double x = L2 + slot * i + (slot - bw) / 2;
    double acc = 0;
    for (int t = 0; t < 3; ++t) {
      const double h = PH * parts[t];
      s << "<rect x=\"" << x << "\" y=\"" << T + PH * (1 - acc) - h << "\" width=\"" << bw
        << "\" height=\"" << h << "\" fill=\"" << tier_color[t] << "\"><title>" << tier_name[t]
        << " " << Pct(parts[t]) << "</title></rect>\n";
      acc += parts[t];
    }
    s << "<text x=\"" << x + bw / 2 << "\" y=\"" << T + PH * (1 - acc) - 6
      << "\" text-anchor=\"middle\" font-weight=\"bold\">" << Pct(p.hit_rate()) << "</text>\n"
      << "<text x=\"" << x + bw / 2 << "\" y=\"" << T + PH + 16
      << "\" text-anchor=\"middle\" fill=\"" << Color(i) << "\">" << Esc(p.policy) << "</text>\n";
  }
  for (int t = 0; t < 3; ++t) {
    s << "<rect x=\"" << L2 + 10 + 80 * t << "\" y=\"" << T + PH + 26
      << "\" width=\"12\" height=\"12\" fill=\"" << tier_color[t] << "\"/><text x=\""
      << L2 + 26 + 80 * t << "\" y=\"" << T + PH + 37 << "\">" << tier_name[t] << "</text>\n";
  }
  s << "<text x=\"20\" y=\"" << H - 12 << "\">" << r.mismatches() << " mismatches; index "
    << (r.consistent() ? "consistent with every engine" : "INCONSISTENT") << "; total wall "
    << Fmt("%.1f", r.wall_s) << " s</text>\n";
  s << "</svg>\n";
  return s.str();
}

}  // namespace kvo::demo
