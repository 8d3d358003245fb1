// A dependency-free SVG line chart for `kvo plan --svg` (hit rate vs capacity, log x axis).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "planner/planner.h"

namespace kvo {
namespace {

std::string Fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string HumanTokens(double t) {
  if (t >= 1e9) return Fmt("%gG", t / 1e9);
  if (t >= 1e6) return Fmt("%gM", t / 1e6);
  if (t >= 1e3) return Fmt("%gk", t / 1e3);
  return Fmt("%g", t);
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

std::string RenderPlanSvg(const std::vector<PlanPoint>& points, const PlanPoint& maximum,
                          const std::string& title) {
  const double width = 720, height = 440, left = 70, right = 150, top = 40, bottom = 60;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  double min_cap = 1e300, max_cap = 0, max_rate = maximum.hit_rate();
  for (const PlanPoint& p : points) {
    min_cap = std::min(min_cap, double(std::max<uint64_t>(p.capacity_tokens, 1)));
    max_cap = std::max(max_cap, double(std::max<uint64_t>(p.capacity_tokens, 1)));
    max_rate = std::max(max_rate, p.hit_rate());
  }
  if (points.empty()) min_cap = max_cap = 1;
  double lo = std::floor(std::log10(min_cap)), hi = std::ceil(std::log10(max_cap));
  if (hi <= lo) hi = lo + 1;
  double y_max = std::min(1.0, std::ceil(max_rate * 10 + 0.5) / 10);
  if (y_max <= 0) y_max = 1;
  auto x = [&](double cap) { return left + (std::log10(cap) - lo) / (hi - lo) * plot_w; };
  auto y = [&](double rate) { return top + plot_h - rate / y_max * plot_h; };

  std::string svg = Fmt("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%g\"", width) +
                    Fmt(" height=\"%g\" font-family=\"sans-serif\" font-size=\"12\">\n", height);
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += Fmt("<text x=\"%g\" y=\"24\" font-size=\"15\">", left) + Escape(title) + "</text>\n";
  // Axes, grid and ticks.
  for (double e = lo; e <= hi; ++e) {
    double px = x(std::pow(10, e));
    svg += Fmt("<line x1=\"%g\"", px) + Fmt(" y1=\"%g\"", top) + Fmt(" x2=\"%g\"", px) +
           Fmt(" y2=\"%g\" stroke=\"#ddd\"/>\n", top + plot_h);
    svg += Fmt("<text x=\"%g\"", px) + Fmt(" y=\"%g\" text-anchor=\"middle\">", top + plot_h + 18) +
           HumanTokens(std::pow(10, e)) + "</text>\n";
  }
  for (int i = 0; i <= 5; ++i) {
    double rate = y_max * i / 5, py = y(rate);
    svg += Fmt("<line x1=\"%g\"", left) + Fmt(" y1=\"%g\"", py) + Fmt(" x2=\"%g\"", left + plot_w) +
           Fmt(" y2=\"%g\" stroke=\"#ddd\"/>\n", py);
    svg += Fmt("<text x=\"%g\"", left - 8) + Fmt(" y=\"%g\" text-anchor=\"end\">", py + 4) +
           Fmt("%.0f%%", rate * 100) + "</text>\n";
  }
  svg += Fmt("<text x=\"%g\"", left + plot_w / 2) +
         Fmt(" y=\"%g\" text-anchor=\"middle\">CPU tier capacity (tokens, log scale)</text>\n",
             height - 16);
  svg += Fmt("<text transform=\"translate(18,%g) rotate(-90)\" text-anchor=\"middle\">",
             top + plot_h / 2) +
         "prefix hit rate</text>\n";
  // The theoretical maximum.
  double my = y(maximum.hit_rate());
  svg += Fmt("<line x1=\"%g\"", left) + Fmt(" y1=\"%g\"", my) + Fmt(" x2=\"%g\"", left + plot_w) +
         Fmt(" y2=\"%g\" stroke=\"#555\" stroke-dasharray=\"6 4\"/>\n", my);
  svg += Fmt("<text x=\"%g\"", left + plot_w + 6) + Fmt(" y=\"%g\">", my + 4) +
         Fmt("max %.1f%%", maximum.hit_rate() * 100) + "</text>\n";
  // One line per policy.
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  std::map<std::string, std::vector<const PlanPoint*>> by_policy;
  for (const PlanPoint& p : points) by_policy[p.policy].push_back(&p);
  int series = 0;
  for (auto& [policy, pts] : by_policy) {
    std::sort(pts.begin(), pts.end(), [](const PlanPoint* a, const PlanPoint* b) {
      return a->capacity_tokens < b->capacity_tokens;
    });
    const char* color = kColors[series % 5];
    std::string path;
    for (const PlanPoint* p : pts) {
      double px = x(double(std::max<uint64_t>(p->capacity_tokens, 1))), py = y(p->hit_rate());
      path += Fmt(path.empty() ? "%g" : " %g", px) + Fmt(",%g", py);
      svg += Fmt("<circle cx=\"%g\"", px) + Fmt(" cy=\"%g\" r=\"3.5\" fill=\"", py) + color +
             "\"><title>" + Escape(policy) + " " + HumanTokens(double(p->capacity_tokens)) +
             Fmt(" tokens: %.2f%%", p->hit_rate() * 100) + "</title></circle>\n";
    }
    svg += "<polyline fill=\"none\" stroke-width=\"2\" stroke=\"" + std::string(color) +
           "\" points=\"" + path + "\"/>\n";
    double ly = top + 16 + 18 * series;
    svg += Fmt("<line x1=\"%g\"", left + plot_w + 10) + Fmt(" y1=\"%g\"", ly + 40) +
           Fmt(" x2=\"%g\"", left + plot_w + 34) +
           Fmt(" y2=\"%g\" stroke-width=\"2\" stroke=\"", ly + 40) + color + "\"/>\n";
    svg += Fmt("<text x=\"%g\"", left + plot_w + 40) + Fmt(" y=\"%g\">", ly + 44) + Escape(policy) +
           "</text>\n";
    ++series;
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace kvo
