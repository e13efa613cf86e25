"""The book's chart theme and offline renderer."""

from __future__ import annotations

import json

import altair as alt
import pandas as pd
import pytest

from kvdro import plotting


@pytest.fixture
def chart():
    data = pd.DataFrame({"buffer": [0, 10, 20], "cost": [5.0, 2.0, 3.0]})
    return alt.Chart(data).mark_line().encode(x="buffer:Q", y="cost:Q")


def test_enable_turns_on_theme_and_offline_renderer(chart):
    plotting.enable()
    assert alt.theme.active == plotting.THEME_NAME
    assert alt.renderers.active == plotting.RENDERER_NAME
    spec = chart.to_dict()
    assert spec["config"]["range"]["category"] == list(plotting.PALETTE)


def test_chart_html_is_offline_and_deterministic(chart):
    plotting.enable()
    spec = chart.to_dict()
    html = plotting.chart_html(spec)
    assert html == plotting.chart_html(spec), "same spec, same HTML (stable id, no timestamps)"
    assert f'id="{plotting.chart_id(spec)}"' in html
    assert "<svg" in html, "static SVG fallback for readers without JavaScript"
    assert "http://" not in html.split("<svg")[0] and "cdn" not in html.lower()
    embedded = html.split('class="kvdro-spec">')[1].split("</script>")[0]
    assert json.loads(embedded) == json.loads(json.dumps(spec, sort_keys=True))


def test_chart_id_changes_with_the_spec(chart):
    a = chart.to_dict()
    b = chart.properties(title="other").to_dict()
    assert plotting.chart_id(a) != plotting.chart_id(b)


def test_mimebundle_carries_html_and_vegalite_spec(chart):
    plotting.enable()
    bundle = plotting.render_offline(chart.to_dict())
    assert "text/html" in bundle
    assert any(k.startswith("application/vnd.vegalite.v") for k in bundle)


def test_spec_cannot_break_out_of_its_script_tag():
    spec = {"$schema": "https://vega.github.io/schema/vega-lite/v6.json", "data": {"values": [{"a": "</script><b>x"}]},
            "mark": "point", "encoding": {"x": {"field": "a", "type": "nominal"}}}
    html = plotting.chart_html(spec)
    assert html.count("</script>") == 2, "only the spec's and the loader's own closing tags"
    assert json.loads(html.split('class="kvdro-spec">')[1].split("</script>")[0]) == spec


def _six_class_chart(**props) -> alt.Chart:
    names = ["code-short", "code-medium", "code-long", "conversation-short", "conversation-medium", "conversation-long"]
    data = pd.DataFrame({"x": list(range(10)) * 6, "y": range(60), "class": [n for n in names for _ in range(10)]})
    return alt.Chart(data, title="Optimal buffer per class as the cost ratio grows").mark_line().encode(
        x=alt.X("x:Q", title="cost ratio"), y=alt.Y("y:Q", title="buffer (tokens)"), color=alt.Color("class:N", title="class")
    ).properties(**props)


def test_default_chart_fits_the_text_column_with_axes_and_legend():
    """A single view with six legend entries and axis titles is WIDTH wide in total, within the column."""
    plotting.enable()
    assert plotting.WIDTH <= plotting.COLUMN_PX - 40  # room for the output area's own padding
    assert plotting.rendered_width(_six_class_chart()) <= plotting.WIDTH
    assert plotting.rendered_width(_six_class_chart(width=300)) <= 300
    # without the theme (Altair's default "pad" autosize, legend on the right) the same chart is wider
    alt.theme.enable("default")
    try:
        assert plotting.rendered_width(_six_class_chart(width=plotting.WIDTH)) > plotting.WIDTH + 50
    finally:
        plotting.enable()


def test_legend_defaults_to_the_bottom():
    plotting.enable()
    legend = plotting.kvdro_theme()["config"]["legend"]
    assert legend["orient"] == "bottom" and legend["columns"] <= 3
