// The ldm7 monitor's dashboard: nodes on a US map colored by the age of their last report,
// publisher → subscriber links, and a link's per-step series of the chosen metric. Data from
// the monitor's JSON API; it refreshes itself every 30 s.
import * as d3 from "d3";
import { feature, mesh } from "topojson-client";
import us from "us-atlas/states-albers-10m.json";

// The projection the pre-projected atlas was made with.
const projection = d3.geoAlbersUsa().scale(1300).translate([487.5, 305]);
const state = { feed: "", metric: "throughput_fmtp", range: 3600, selected: null, nodes: [], links: [] };

const map = d3.select("#map");
map.append("g").selectAll("path")
  .data(feature(us, us.objects.states).features)
  .join("path").attr("class", "state").attr("d", d3.geoPath());
map.append("path").datum(mesh(us, us.objects.states, (a, b) => a !== b))
  .attr("fill", "none").attr("stroke", "#fff").attr("d", d3.geoPath());
const linkLayer = map.append("g");
const nodeLayer = map.append("g");

const position = (node) => (node && node.latitude != null && node.longitude != null)
  ? projection([node.longitude, node.latitude]) : null;
const linkKey = (link) => `${link.feed}|${link.publisher}|${link.subscriber}`;

async function json(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: ${response.status}`);
  return response.json();
}

function drawNodes() {
  const placed = state.nodes.filter((node) => position(node));
  nodeLayer.selectAll("g.node-group").data(placed, (node) => node.name)
    .join((enter) => {
      const group = enter.append("g").attr("class", "node-group");
      group.append("circle").attr("r", 7);
      group.append("text").attr("dx", 9).attr("dy", 4);
      group.append("title");
      return group;
    })
    .attr("transform", (node) => `translate(${position(node)})`)
    .call((group) => group.select("circle").attr("class", (node) => `node ${node.color}`).attr("data-name", (node) => node.name))
    .call((group) => group.select("text").text((node) => node.name))
    .call((group) => group.select("title").text((node) => node.last_report == null
      ? `${node.name}: never reported`
      : `${node.name}: last report ${Math.round(node.age_s / 60)} min ago (${node.kind})`));
}

function drawLinks() {
  const byName = new Map(state.nodes.map((node) => [node.name, node]));
  const drawable = state.links.filter((link) => position(byName.get(link.publisher)) && position(byName.get(link.subscriber)));
  linkLayer.selectAll("line.link").data(drawable, linkKey)
    .join("line")
    .attr("class", (link) => `link${state.selected === linkKey(link) ? " selected" : ""}`)
    .attr("data-link", linkKey)
    .each(function (link) {
      const [x1, y1] = position(byName.get(link.publisher));
      const [x2, y2] = position(byName.get(link.subscriber));
      d3.select(this).attr("x1", x1).attr("y1", y1).attr("x2", x2).attr("y2", y2);
    })
    .on("click", (_, link) => select(link));
  const rows = d3.select("#links tbody").selectAll("tr").data(state.links, linkKey)
    .join("tr")
    .attr("class", (link) => `link-row${state.selected === linkKey(link) ? " selected" : ""}`)
    .attr("data-link", linkKey)
    .on("click", (_, link) => select(link));
  rows.selectAll("td")
    .data((link) => [link.feed, link.publisher, link.subscriber, new Date(link.last_minute * 60000).toISOString().slice(0, 16).replace("T", " ")])
    .join("td").text((text) => text);
}

async function drawChart() {
  const chart = d3.select("#chart");
  chart.selectAll("*").remove();
  const link = state.links.find((candidate) => linkKey(candidate) === state.selected);
  if (!link) return;
  const to = Math.floor(Date.now() / 1000);
  const step = Math.max(1, Math.round(state.range / 3600 / 2));
  const query = new URLSearchParams({ feed: link.feed, publisher: link.publisher, subscriber: link.subscriber,
    metric: state.metric, from: to - state.range, to, step });
  const series = await json(`/api/series?${query}`);
  const points = series.points.filter(([, value]) => value != null).map(([time, value]) => [new Date(time * 1000), value]);
  d3.select("#chart-title").text(`${link.publisher} → ${link.subscriber} (${link.feed}): ${d3.select("#metric option:checked").text()}`);
  const [width, height, margin] = [640, 260, { top: 10, right: 15, bottom: 25, left: 70 }];
  const x = d3.scaleUtc().domain([new Date((to - state.range) * 1000), new Date(to * 1000)]).range([margin.left, width - margin.right]);
  const y = d3.scaleLinear().domain([0, d3.max(points, ([, value]) => value) || 1]).nice().range([height - margin.bottom, margin.top]);
  chart.append("g").attr("transform", `translate(0,${height - margin.bottom})`).call(d3.axisBottom(x).ticks(6));
  chart.append("g").attr("transform", `translate(${margin.left},0)`).call(d3.axisLeft(y).ticks(5, "~s"));
  chart.append("path").datum(points).attr("class", "line").attr("d", d3.line().x(([time]) => x(time)).y(([, value]) => y(value)));
  chart.append("g").selectAll("circle").data(points).join("circle").attr("class", "point").attr("r", 2.5)
    .attr("cx", ([time]) => x(time)).attr("cy", ([, value]) => y(value));
}

function select(link) {
  state.selected = linkKey(link);
  drawLinks();
  drawChart().catch(report);
}

function report(error) {
  d3.select("#updated").text(`error: ${error.message}`);
}

async function refresh() {
  const feedQuery = state.feed ? `?feed=${encodeURIComponent(state.feed)}` : "";
  const [nodes, links, allLinks] = await Promise.all([json("/api/nodes"), json(`/api/links${feedQuery}`), json("/api/links")]);
  state.nodes = nodes;
  state.links = links;
  const feeds = [...new Set(allLinks.map((link) => link.feed))].sort();
  d3.select("#feed").selectAll("option.feed").data(feeds, (feed) => feed)
    .join("option").attr("class", "feed").attr("value", (feed) => feed).text((feed) => feed);
  drawNodes();
  drawLinks();
  await drawChart();
  d3.select("#updated").text(`updated ${new Date().toISOString().slice(11, 19)} UTC`);
}

d3.select("#feed").on("change", (event) => { state.feed = event.target.value; refresh().catch(report); });
d3.select("#metric").on("change", (event) => { state.metric = event.target.value; drawChart().catch(report); });
d3.select("#range").on("change", (event) => { state.range = Number(event.target.value); drawChart().catch(report); });
refresh().catch(report);
setInterval(() => refresh().catch(report), 30000);
