/* Feature atlas: a static application over data files loaded with <script src> (works from file://). */
"use strict";
var ATLAS = (function () {
  var state = { index: null, search: null, shards: {}, waiting: {}, dicts: {}, pageSize: 512 };

  function el(tag, attrs, children) {
    var node = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") node.textContent = attrs[k];
      else if (k === "cls") node.className = attrs[k];
      else node.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) node.appendChild(typeof c === "string" ? document.createTextNode(c) : c); });
    return node;
  }
  function fmt(x) {
    if (x === null || x === undefined) return "–";
    var a = Math.abs(x);
    if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
    return (+x.toPrecision(4)).toString();
  }
  function main() { return document.getElementById("main"); }
  function setMain(nodes, title) {
    var m = main();
    m.innerHTML = "";
    nodes.forEach(function (n) { if (n) m.appendChild(n); });
    m.setAttribute("data-route", location.hash);  /* the page of this route is drawn (tests wait for it) */
    document.title = (title ? title + " — " : "") + "Feature atlas";
  }
  function featureHref(slug, i) { return "#f/" + encodeURIComponent(slug) + "/" + i; }

  /* ----- data loading ----- */
  function builtIds(d) {
    /* The built features, ascending: the index's [first, last] runs (an atlas written before they existed: every id
       of each shard's range). */
    var ids = [], runs = d.built || d.shards.map(function (s) { return [s[1], s[2]]; });
    runs.forEach(function (r) { for (var i = r[0]; i <= r[1]; i++) ids.push(i); });
    return ids;
  }
  function index(data) {
    state.index = data;
    data.dictionaries.forEach(function (d, n) { d.order = n; d.ids = builtIds(d); state.dicts[d.slug] = d; });
  }
  function position(d, i) {
    /* Where feature i is in d.ids (binary search); -1 when it was not built. */
    var lo = 0, hi = d.ids.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (d.ids[mid] < i) lo = mid + 1; else hi = mid; }
    return lo < d.ids.length && d.ids[lo] === i ? lo : -1;
  }
  function search(data) {
    state.search = data;
  }
  function shard(slug, start, data) {
    var key = slug + "/" + start;
    state.shards[key] = data;
    (state.waiting[key] || []).forEach(function (f) { f(data); });
    delete state.waiting[key];
  }
  function shardOf(d, i) {
    for (var n = 0; n < d.shards.length; n++) {
      var s = d.shards[n];
      if (i >= s[1] && i <= s[2]) return s[0];
    }
    return null;
  }
  function loadShard(slug, start, done) {
    var key = slug + "/" + start;
    if (state.shards[key]) { done(state.shards[key]); return; }
    if (!state.waiting[key]) {
      state.waiting[key] = [];
      var s = document.createElement("script");
      s.src = "data/" + encodeURIComponent(slug) + "/" + start + ".js";
      s.onerror = function () { setMain([el("p", { text: "Missing data file " + s.src + "." })]); };
      document.body.appendChild(s);
    }
    state.waiting[key].push(done);
  }

  /* ----- search ----- */
  function normalise(text) {
    return text.trim().replace(/^[\s\u0120\u2581]+/, "").trim().toLowerCase();
  }
  function lowerBound(keys, q) {
    var lo = 0, hi = keys.length;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (keys[mid] < q) lo = mid + 1; else hi = mid; }
    return lo;
  }
  function runSearch(text) {
    var t0 = performance.now();
    var out = { features: [], dicts: [], direct: null };
    var raw = text.trim();
    var m = raw.match(/^(\S+?)\s*[\/#:]\s*(\d+)$/);
    if (m && state.dicts[m[1]]) out.direct = [m[1], +m[2]];
    var layer = raw.match(/^(?:layer|l)\s*(\d+)$/i);
    if (layer) {
      state.index.dictionaries.forEach(function (d) { if (d.layer === +layer[1]) out.dicts.push(d); });
    }
    var q = normalise(raw);
    if (q && state.search) {
      var keys = state.search.keys, refs = state.search.refs, dicts = state.search.dicts;
      var score = {};
      var start = lowerBound(keys, q);
      for (var k = start, seen = 0; k < keys.length && seen < 200 && keys[k].lastIndexOf(q, 0) === 0; k++, seen++) {
        var boost = keys[k] === q ? 2 : 0.5, r = refs[k];
        for (var j = 0; j < r.length; j += 3) {
          var id = dicts[r[j]] + "/" + r[j + 1];
          score[id] = (score[id] || 0) + boost * r[j + 2];
        }
      }
      out.features = Object.keys(score).map(function (id) { return [id, score[id]]; })
        .sort(function (a, b) { return b[1] - a[1] || (a[0] < b[0] ? -1 : 1); }).slice(0, 100);
    }
    out.ms = performance.now() - t0;
    window.ATLAS_LAST_SEARCH_MS = out.ms;
    return out;
  }
  function showSearch(text) {
    var r = runSearch(text);
    document.getElementById("timing").textContent = r.features.length + " features in " + r.ms.toFixed(1) + " ms";
    var nodes = [el("h1", { text: "Search: " + text })];
    if (r.direct) nodes.push(el("p", {}, [el("a", { href: featureHref(r.direct[0], r.direct[1]), text: "Open feature " + r.direct[0] + "/" + r.direct[1] })]));
    if (r.dicts.length) {
      nodes.push(el("h2", { text: "Dictionaries of that layer" }));
      nodes.push(el("ul", { cls: "results" }, r.dicts.map(function (d) {
        return el("li", {}, [el("a", { href: "#d/" + encodeURIComponent(d.slug), text: d.label + " (" + d.slug + ")" })]);
      })));
    }
    nodes.push(el("h2", { text: r.features.length ? "Features (ranked)" : "No feature has this token in its signatures or top contexts" }));
    var previews = [];
    nodes.push(el("ol", { cls: "results", id: "results" }, r.features.map(function (f, n) {
      var parts = f[0].split("/"), d = state.dicts[parts[0]];
      var box = el("div", { cls: "preview" });
      if (d && n < PREVIEWS) previews.push([d, +parts[1], box]);
      return el("li", {}, [el("a", { href: featureHref(parts[0], parts[1]), text: (d ? d.label : parts[0]) + " #" + parts[1] }),
        el("span", { cls: "score", text: "score " + fmt(f[1]) }), box]);
    })));
    setMain(nodes, "Search");
    previews.forEach(function (p) { preview(p[0], p[1], p[2]); });
  }
  var PREVIEWS = 20;  /* results that get a preview (each loads its feature's data file) */
  function preview(d, i, box) {
    /* A result's top activating tokens (the peaks of its top contexts) and its best context, once its shard loads. */
    var start = position(d, i) < 0 ? null : shardOf(d, i);
    if (start === null) return;
    loadShard(d.slug, start, function (data) {
      var f = null;
      for (var n = 0; n < data.features.length; n++) if (data.features[n].i === i) f = data.features[n];
      if (!f || !f.top.length) return;
      var peaks = [];
      f.top.forEach(function (c) { var t = data.strings[c.t[c.m]]; if (peaks.indexOf(t) < 0 && peaks.length < 5) peaks.push(t); });
      box.appendChild(el("div", { cls: "peaks" }, [el("span", { cls: "muted", text: "top tokens " })].concat(
        peaks.map(function (t) { return el("span", { cls: "chip", text: t }); }))));
      var c = f.top[0], from = Math.max(0, c.m - 8);
      box.appendChild(el("div", { cls: "ctx snippet" }, c.t.slice(from, c.m + 3).map(function (t, j) {
        return el("span", { cls: "t" + (from + j === c.m ? " peak" : ""), text: data.strings[t] });
      })));
    });
  }

  /* ----- pages ----- */
  function home() {
    var idx = state.index;
    var rows = idx.dictionaries.map(function (d) {
      return el("tr", {}, [el("td", {}, [el("a", { href: "#d/" + encodeURIComponent(d.slug), text: d.label })]),
        el("td", { text: d.slug }), el("td", { text: d.kind }), el("td", { text: String(d.layer) }),
        el("td", { text: String(d.n_features) + " / " + d.d_sae })]);
    });
    setMain([
      el("h1", { text: "Feature atlas — " + idx.model.name }),
      el("p", { cls: "muted", text: idx.dictionaries.length + " dictionaries; contexts from " + idx.n_tokens + " corpus tokens. Keys: / search, ↓↑ move through results, Enter open, ← → previous / next feature, Esc back to search." }),
      el("div", { cls: "scroll" }, [el("table", { id: "dictionaries" }, [el("tr", {}, ["dictionary", "id", "kind", "layer", "features"].map(function (h) { return el("th", { text: h }); }))].concat(rows))]),
    ], "");
  }
  function section(s) {
    var nodes = [el("h2", { text: s.title })];
    var keys = Object.keys(s.scalars || {});
    if (keys.length) {
      nodes.push(el("table", { cls: "scalars" }, keys.map(function (k) { return el("tr", {}, [el("td", { text: k }), el("td", { text: fmt(s.scalars[k]) })]); })));
    }
    Object.keys(s.tables || {}).forEach(function (name) {
      var t = s.tables[name];
      nodes.push(el("h3", { text: name }));
      nodes.push(el("div", { cls: "scroll" }, [el("table", {}, [el("tr", {}, t.columns.map(function (c) { return el("th", { text: c }); }))].concat(
        t.rows.map(function (r) { return el("tr", {}, r.map(function (v) { return el("td", { text: typeof v === "number" ? fmt(v) : String(v === null ? "–" : v) }); })); })))]));
    });
    return el("section", {}, nodes);
  }
  function pageHref(slug, page) { return "#d/" + encodeURIComponent(slug) + (page ? "/" + page : ""); }
  function pager(d, page, pages) {
    if (pages < 2) return null;
    var items = [el("span", { cls: "muted", text: "pages:" })];
    for (var p = 0; p < pages; p++) {
      var first = d.ids[p * state.pageSize], last = d.ids[Math.min(d.ids.length, (p + 1) * state.pageSize) - 1];
      var label = first + "–" + last;
      items.push(p === page ? el("strong", { text: label }) : el("a", { href: pageHref(d.slug, p), text: label }));
    }
    return el("div", { cls: "pager" }, items);
  }
  function dictionaryPage(slug, page) {
    var d = state.dicts[slug];
    if (!d) { setMain([el("p", { text: "No dictionary " + slug + " in this atlas." })]); return; }
    var pages = Math.max(1, Math.ceil(d.ids.length / state.pageSize));
    page = Math.min(Math.max(0, page || 0), pages - 1);
    var nodes = [el("h1", { text: d.label }), el("p", { cls: "muted", text: d.spec + " — reads " + d.read_hook + ", writes " + d.write_hook + "; " + d.n_features + " of " + d.d_sae + " features built" })];
    d.sections.forEach(function (s) { nodes.push(section(s)); });
    if (!d.sections.length) nodes.push(el("p", { cls: "muted", text: "No quality row, certificate or absorption result was given for this dictionary." }));
    nodes.push(el("h2", { text: "Features (" + d.ids.length + " built)" }));
    nodes.push(pager(d, page, pages));
    var shown = d.ids.slice(page * state.pageSize, (page + 1) * state.pageSize);
    nodes.push(el("div", { cls: "list", id: "features" }, shown.map(function (i) { return el("a", { href: featureHref(slug, i), text: String(i) }); })));
    nodes.push(pager(d, page, pages));
    setMain(nodes, d.label);
  }
  function chip(strings, pair, neg) {
    return el("span", {}, [el("span", { cls: "chip" + (neg ? " neg" : ""), text: strings[pair[0]] }), el("span", { cls: "score", text: fmt(pair[1]) })]);
  }
  function sigTable(title, names, f, strings, side, id) {
    var present = names.filter(function (n) { return f.sig && f.sig[n] && f.sig[n][side]; });
    if (!present.length) return null;
    var n = Math.max.apply(null, present.map(function (m) { return f.sig[m][side].length; }));
    var rows = [el("tr", {}, present.map(function (m) { return el("th", { text: m, title: (state.index.methods || {})[m] || m }); }))];
    for (var r = 0; r < n; r++) {
      rows.push(el("tr", {}, present.map(function (m) { var p = f.sig[m][side][r]; return el("td", {}, p ? [chip(strings, p, side === "bottom")] : []); })));
    }
    return el("div", {}, [el("h3", { text: title }), el("div", { cls: "scroll" }, [el("table", { cls: "sigtable", id: id }, rows)])]);
  }
  function histogram(h, id) {
    /* Positions per log bin: positive activations right of 0, negative ones (by magnitude, h.neg) mirrored to its
       left; a count axis on the left. */
    var neg = h && h.neg && h.neg.counts.length ? h.neg : { edges: [], counts: [] };
    if (!h || (!h.counts.length && !neg.counts.length)) return el("p", { cls: "muted", text: "The feature is never non-zero on the corpus." });
    var bins = [];
    for (var k = neg.counts.length - 1; k >= 0; k--) bins.push({ c: neg.counts[k], lo: -neg.edges[k + 1], hi: -neg.edges[k], neg: true });
    h.counts.forEach(function (c, i) { bins.push({ c: c, lo: h.edges[i], hi: h.edges[i + 1], neg: false }); });
    var L = 46, W = 520, H = 120, n = bins.length, bw = W / n;
    var max = Math.max.apply(null, bins.map(function (b) { return b.c; }));
    var ns = "http://www.w3.org/2000/svg";
    function add(parent, tag, attrs, text) {
      var node = document.createElementNS(ns, tag);
      Object.keys(attrs).forEach(function (a) { node.setAttribute(a, attrs[a]); });
      if (text !== undefined) node.textContent = text;
      parent.appendChild(node);
      return node;
    }
    var svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", L + W + 4); svg.setAttribute("height", H + 20); svg.setAttribute("class", "hist"); svg.setAttribute("id", id);
    svg.setAttribute("role", "img"); svg.setAttribute("aria-label", "activation histogram, counts of positions per bin");
    var axis = add(svg, "g", { "class": "yaxis" });
    add(axis, "line", { x1: L - 2, x2: L - 2, y1: 0, y2: H });
    [max, Math.round(max / 2), 0].forEach(function (c) {
      var y = H - (max ? H * c / max : 0);
      add(axis, "line", { x1: L - 6, x2: L - 2, y1: y, y2: y });
      add(axis, "text", { x: L - 8, y: Math.min(H, Math.max(9, y + 4)), "text-anchor": "end" }, String(c));
    });
    add(axis, "text", { x: 0, y: H / 2, transform: "rotate(-90 8 " + H / 2 + ")", "text-anchor": "middle" }, "count");
    bins.forEach(function (b, i) {
      var hh = max ? Math.max(1, H * b.c / max) : 0;
      var r = add(svg, "rect", { x: L + i * bw + 1, width: Math.max(1, bw - 2), y: H - hh, height: hh, "class": b.neg ? "neg" : "pos", "data-count": b.c });
      add(r, "title", {}, fmt(b.lo) + " to " + fmt(b.hi) + ": " + b.c + " positions");
    });
    var labels = [[0, bins[0].lo, "start"], [n, bins[n - 1].hi, "end"]];
    if (neg.counts.length && h.counts.length) labels.push([neg.counts.length, 0, "middle"]);
    labels.forEach(function (l) { add(svg, "text", { x: L + l[0] * bw, y: H + 14, "text-anchor": l[2] }, fmt(l[1])); });
    return svg;
  }
  function context(ctx, strings, scale) {
    var spans = ctx.t.map(function (s, j) {
      var q = ctx.q[j] / 1000, v = q * scale, a = Math.min(1, Math.abs(q));
      var bg = q > 0 ? "rgba(255,140,0," + a.toFixed(3) + ")" : q < 0 ? "rgba(70,130,220," + a.toFixed(3) + ")" : "transparent";
      return el("span", { cls: "t" + (j === ctx.m ? " peak" : ""), style: "background:" + bg, title: "activation " + fmt(v), "data-v": fmt(v), text: strings[s] });
    });
    spans.push(el("span", { cls: "val", text: "max " + fmt(ctx.v) + " at “" + strings[ctx.t[ctx.m]] + "”" }));
    return el("div", { cls: "ctx" }, spans);
  }
  function shares(f) {
    if (!f.shares || !f.shares.length) return null;
    var top = f.shares.slice().sort(function (a, b) { return Math.abs(b[1]) - Math.abs(a[1]); }).slice(0, state.index.shares_shown || 10);
    var m = Math.max.apply(null, top.map(function (p) { return Math.abs(p[1]); })) || 1;
    var rows = top.map(function (p) {
      var w = Math.round(100 * Math.abs(p[1]) / m), bar;
      if (p[1] >= 0) bar = [el("span", { cls: "axis" }), el("span", { cls: "bar pos", style: "width:" + w + "px" })];
      else bar = [el("span", { cls: "axis" }, [el("span", { cls: "bar negbar", style: "width:" + w + "px" })])];
      return el("tr", {}, [el("td", { text: p[0] }), el("td", { cls: "barcell" }, bar), el("td", { text: fmt(p[1]) })]);
    });
    return el("div", {}, [el("h2", { text: "Per-module shares of the value signature" }),
      el("p", { cls: "muted", text: "First-order decomposition of the value scores summed over the feature's top " + (state.index.shares_k || "k") + " value tokens: the direct term and each downstream module; shares sum to 1 and are signed (a module working against the signature is negative, drawn to the left). The " + top.length + " largest by magnitude are shown." }),
      el("table", { id: "shares" }, rows)]);
  }
  function featurePage(slug, i) {
    var d = state.dicts[slug];
    if (!d) { setMain([el("p", { text: "No dictionary " + slug + " in this atlas." })]); return; }
    var start = position(d, i) < 0 ? null : shardOf(d, i);
    if (start === null) { setMain([el("p", { text: "Feature " + i + " of " + d.label + " is not in this atlas." })]); return; }
    loadShard(slug, start, function (data) {
      if (location.hash !== featureHref(slug, i) && location.hash !== "#f/" + slug + "/" + i) return;
      var f = null;
      for (var n = 0; n < data.features.length; n++) if (data.features[n].i === i) f = data.features[n];
      if (!f) { setMain([el("p", { text: "Feature " + i + " is not in its data file." })]); return; }
      renderFeature(d, f, data.strings);
    });
  }
  function neighbour(d, i, step) {
    /* The previous / next built feature (the dictionary's ids need not be consecutive). */
    var at = position(d, i);
    if (at < 0) return null;
    var j = d.ids[at + step];
    return j === undefined ? null : j;
  }
  function renderFeature(d, f, strings) {
    var prev = neighbour(d, f.i, -1), next = neighbour(d, f.i, 1);
    var nav = el("div", { cls: "nav" }, [
      prev !== null ? el("a", { href: featureHref(d.slug, prev), id: "prev", text: "← " + prev }) : null,
      el("a", { href: "#d/" + encodeURIComponent(d.slug), text: d.label }),
      next !== null ? el("a", { href: featureHref(d.slug, next), id: "next", text: next + " →" }) : null]);
    var nodes = [nav, el("h1", { text: d.label + " — feature " + f.i }),
      el("p", { cls: "muted", text: "density " + fmt(f.density) + " (" + f.fires + " positions fire)  ·  max " + fmt(f.max) + "  ·  min " + fmt(f.min) })];
    var signed = f.hist && f.hist.neg && f.hist.neg.counts.length;
    nodes.push(el("h2", { text: "Activation histogram (positions per log bin" + (signed ? "; negative activations left of 0" : "") + ")" }));
    nodes.push(histogram(f.hist, "hist"));
    var value = sigTable("Value — what it promotes (top)", ["LL_VALUE", "QL_VALUE", "QL_INDIRECT"], f, strings, "top", "value-top");
    var bottom = sigTable("Value — what it suppresses (bottom)", ["LL_VALUE", "QL_VALUE", "QL_INDIRECT"], f, strings, "bottom", "value-bottom");
    var key = sigTable("Key — what activates it", ["LL_KEY", "QL_KEY"], f, strings, "top", "key-top");
    if (value || key) {
      nodes.push(el("h2", { text: "Signatures: logit lens beside Query Lens" }));
      nodes.push(el("div", { cls: "sigs", id: "signatures" }, [value, bottom, key]));
    }
    if (f.sig_missing) nodes.push(el("p", { cls: "muted", text: "Not available: " + Object.keys(f.sig_missing).map(function (k) { return k + " (" + f.sig_missing[k] + ")"; }).join("; ") }));
    nodes.push(shares(f));
    if (f.links && f.links.length) {
      nodes.push(el("h2", { text: d.kind === "ffkv" ? "Transcoder features writing like this neuron" : "Best-matching MLP neurons" }));
      nodes.push(el("table", { id: "links" }, f.links.map(function (l) {
        var target = state.dicts[l[0]];
        var name = (target ? target.label : l[0]) + " #" + l[1];
        var built = target && position(target, l[1]) >= 0;  /* a link only to a feature this atlas holds */
        return el("tr", {}, [el("td", {}, [built ? el("a", { href: featureHref(l[0], l[1]), text: name }) : el("span", { text: name })]), el("td", { text: "cos " + fmt(l[2]) })]);
      })));
    }
    if (f.readout && f.readout.length) {
      nodes.push(el("h2", { text: "Tokens it reads out" }));
      nodes.push(el("div", { id: "readout" }, f.readout.map(function (p) { return chip(strings, p, false); })));
    }
    nodes.push(el("h2", { text: "Top " + f.top.length + " contexts" }));
    nodes.push(el("div", { id: "top-contexts" }, f.top.length ? f.top.map(function (c) { return context(c, strings, f.scale); }) : [el("p", { cls: "muted", text: "No context where it fires." })]));
    f.bands.forEach(function (b) {
      nodes.push(el("h2", { text: b.name + " (max " + fmt(b.lo) + " to " + fmt(b.hi) + ")" }));
      nodes.push(el("div", { cls: "band" }, b.ex.map(function (c) { return context(c, strings, f.scale); })));
    });
    setMain(nodes, d.label + " #" + f.i);
  }

  /* ----- routing and keys ----- */
  function route() {
    var h = decodeURIComponent(location.hash.replace(/^#/, ""));
    var m;
    if ((m = h.match(/^f\/([^\/]+)\/(\d+)$/))) featurePage(m[1], +m[2]);
    else if ((m = h.match(/^d\/([^\/]+)\/(\d+)$/))) dictionaryPage(m[1], +m[2]);
    else if ((m = h.match(/^d\/(.+)$/))) dictionaryPage(m[1], 0);
    else if ((m = h.match(/^q\/(.*)$/))) { document.getElementById("search").value = m[1]; showSearch(m[1]); }
    else home();
  }
  function keys(e) {
    var box = document.getElementById("search");
    var typing = document.activeElement === box;
    if (e.key === "/" && !typing) { e.preventDefault(); box.focus(); box.select(); return; }
    if (e.key === "Escape") { box.focus(); box.select(); return; }
    var links = Array.prototype.slice.call(document.querySelectorAll("#results a"));
    if (e.key === "ArrowDown" || e.key === "ArrowUp") {
      if (!links.length) return;
      var at = links.indexOf(document.activeElement);
      var to = e.key === "ArrowDown" ? Math.min(links.length - 1, at + 1) : at - 1;
      e.preventDefault();
      if (to < 0) box.focus(); else links[to].focus();
      return;
    }
    if (typing) return;
    if (e.key === "ArrowLeft" || e.key === "ArrowRight") {
      var a = document.getElementById(e.key === "ArrowLeft" ? "prev" : "next");
      if (a) { e.preventDefault(); location.hash = a.getAttribute("href"); }
    }
  }
  function start() {
    if (!state.index) { setMain([el("p", { text: "data/index.js did not load: open index.html from the atlas folder." })]); return; }
    var box = document.getElementById("search"), timer = null;
    box.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { if (box.value.trim()) showSearch(box.value); else home(); }, 80);
    });
    box.addEventListener("keydown", function (e) {
      if (e.key === "Enter") {
        clearTimeout(timer);
        var first = document.querySelector("#results a");
        showSearch(box.value);
        first = document.querySelector("#results a");
        if (first) first.focus();
      }
    });
    document.addEventListener("keydown", keys);
    window.addEventListener("hashchange", route);
    route();
  }
  function setPageSize(n) { state.pageSize = n; }
  return { index: index, search: search, shard: shard, start: start, runSearch: runSearch, setPageSize: setPageSize };
})();
