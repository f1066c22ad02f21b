//! The buyer's sale page and the operator's page, as bytes the servers embed.
//!
//! **Role.** The first layer of a flash sale is the page itself: a static page that a CDN can
//! cache, a buy button that JavaScript opens only at the start on the server's clock and
//! counts at most once per 2 s, and a waiting room that lets a buyer buy only with the ticket
//! handed out at its turn. This crate holds that page and the operator's live view, compiled
//! into the binary (`include_bytes!`), so a node serves `/sale/{sku}` and `/web/*` and a
//! coordinator `/ops` with no files to deploy beside the binary.
//!
//! - [`sale_page`]: `/sale/{sku}`, the same bytes for every SKU (the script reads the SKU
//!   from the path). It talks to the node's room, purchase and stock routes and to the order
//!   service, all on the page's origin.
//! - [`ops_page`]: `/ops`, reading the coordinator's `GET /admin/cluster` with the admin token.
//! - [`asset`]: the files under `/web/` the pages load.
//!
//! **Guarantees.** Every file is same-origin only: no CDN, no web font, no inline script or
//! style, so the pages run under [`CONTENT_SECURITY_POLICY`]. The pages set no cookie: the
//! buyer's id lives in `sessionStorage`, a signed-in buyer's token in the URL fragment, the
//! admin token in `sessionStorage`. The element ids tests and monitoring read are stable
//! ([`SALE_PAGE_IDS`], [`OPS_PAGE_IDS`]); the unit tests below hold the files to all of this.
//!
//! **Non-goals.** Routing, caching headers and compression belong to the servers and the load
//! balancer; nothing here decides a sale (a page shown one unit too many is refused by the
//! node). No framework and no build step: the files are served as written.
//!
//! **Layout.** One file: the assets and their content types; the files themselves sit beside
//! `src/` (`sale.html`, `sale.js`, `sale.css`, `ops.html`, `ops.js`, `ops.css`, `favicon.svg`).

/// One file to serve: its `Content-Type` and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asset {
    pub content_type: &'static str,
    pub body: &'static [u8],
}

impl Asset {
    /// The headers every server sends with it: its type, [`CONTENT_SECURITY_POLICY`], and no
    /// type sniffing.
    pub fn headers(&self) -> [(&'static str, &'static str); 3] {
        [
            ("content-type", self.content_type),
            ("content-security-policy", CONTENT_SECURITY_POLICY),
            ("x-content-type-options", "nosniff"),
        ]
    }
}

/// The policy the pages are written for: everything from the page's own origin, nothing
/// inline. A server sends it with each page so that an injected script cannot run.
pub const CONTENT_SECURITY_POLICY: &str =
    "default-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// Element ids of the sale page that tests and operators' monitoring rely on.
pub const SALE_PAGE_IDS: [&str; 7] = ["countdown", "buy", "position", "result", "stock", "order", "pay"];

/// Element ids of the operator's page: the token input, the SKU table, the time of the last
/// read.
pub const OPS_PAGE_IDS: [&str; 5] = ["token", "skus", "updated", "chart-units", "chart-requests"];

/// Where the pages load their files from; `asset` takes the name after it.
pub const ASSET_PREFIX: &str = "/web/";

const HTML: &str = "text/html; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// Every file under [`ASSET_PREFIX`], by name. A fixed list, not a directory lookup: a name
/// a client sends can only ever select one of these.
const ASSETS: [(&str, Asset); 5] = [
    ("sale.js", Asset { content_type: JAVASCRIPT, body: include_bytes!("../sale.js") }),
    ("sale.css", Asset { content_type: CSS, body: include_bytes!("../sale.css") }),
    ("ops.js", Asset { content_type: JAVASCRIPT, body: include_bytes!("../ops.js") }),
    ("ops.css", Asset { content_type: CSS, body: include_bytes!("../ops.css") }),
    ("favicon.svg", Asset { content_type: SVG, body: include_bytes!("../favicon.svg") }),
];

/// The HTML served at `/sale/{sku}`: the same bytes for every SKU, so a CDN caches one copy
/// per page version, and the script reads the SKU from `location.pathname`.
pub fn sale_page() -> Asset {
    Asset { content_type: HTML, body: include_bytes!("../sale.html") }
}

/// The HTML served at `/ops`.
pub fn ops_page() -> Asset {
    Asset { content_type: HTML, body: include_bytes!("../ops.html") }
}

/// A file under `/web/` by its name (`"sale.js"`); `None` for any other name.
pub fn asset(name: &str) -> Option<Asset> {
    ASSETS.iter().find(|(known, _)| *known == name).map(|(_, asset)| *asset)
}

/// The names [`asset`] answers, for a server's routes or a cache warm-up.
pub fn asset_names() -> impl Iterator<Item = &'static str> {
    ASSETS.iter().map(|(name, _)| *name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(asset: Asset) -> &'static str {
        std::str::from_utf8(asset.body).expect("every page file is UTF-8")
    }

    fn pages() -> [(&'static str, &'static str); 2] {
        [("sale.html", text(sale_page())), ("ops.html", text(ops_page()))]
    }

    /// Every file by name, the pages included.
    fn every_file() -> Vec<(&'static str, &'static str)> {
        let mut files = pages().to_vec();
        files.extend(asset_names().map(|name| (name, text(asset(name).expect("listed")))));
        files
    }

    /// The values of `attribute="…"` in `html`.
    fn attribute_values<'a>(html: &'a str, attribute: &str) -> Vec<&'a str> {
        let needle = format!(" {attribute}=\"");
        html.match_indices(&needle)
            .map(|(at, _)| {
                let rest = &html[at + needle.len()..];
                &rest[..rest.find('"').expect("attribute values are closed")]
            })
            .collect()
    }

    /// The string arguments of `$("…")` in a script: the ids it looks up.
    fn looked_up_ids(script: &str) -> Vec<&str> {
        script
            .match_indices("$(\"")
            .map(|(at, _)| {
                let rest = &script[at + 3..];
                &rest[..rest.find('"').expect("closed string")]
            })
            .collect()
    }

    #[test]
    fn every_file_a_page_references_is_served() {
        for (page, html) in pages() {
            let referenced: Vec<&str> =
                attribute_values(html, "src").into_iter().chain(attribute_values(html, "href")).collect();
            assert!(referenced.len() >= 3, "{page} loads its script, its style and its icon: {referenced:?}");
            for path in referenced {
                let name =
                    path.strip_prefix(ASSET_PREFIX).unwrap_or_else(|| panic!("{page}: {path} is not under /web/"));
                assert!(asset(name).is_some(), "{page} references {path}, which asset() does not serve");
            }
        }
    }

    #[test]
    fn the_ids_tests_rely_on_exist_once() {
        let count = |html: &str, id: &str| html.matches(&format!(" id=\"{id}\"")).count();
        for id in SALE_PAGE_IDS {
            assert_eq!(count(text(sale_page()), id), 1, "sale.html has no single element with id {id}");
        }
        for id in OPS_PAGE_IDS {
            assert_eq!(count(text(ops_page()), id), 1, "ops.html has no single element with id {id}");
        }
        assert!(text(ops_page()).contains("<table id=\"skus\">"), "#skus is a table");
        assert!(text(ops_page()).contains("type=\"password\""), "the admin token is typed into a password input");
    }

    #[test]
    fn every_id_a_script_looks_up_is_on_its_page() {
        for (script, page) in [("sale.js", sale_page()), ("ops.js", ops_page())] {
            let ids = looked_up_ids(text(asset(script).expect("script")));
            assert!(!ids.is_empty(), "{script} looks up its elements with $(\"id\")");
            for id in ids {
                assert!(
                    text(page).contains(&format!(" id=\"{id}\"")),
                    "{script} looks up #{id}, missing from its page"
                );
            }
        }
    }

    #[test]
    fn nothing_is_loaded_from_another_origin() {
        for (name, content) in every_file() {
            // The SVG namespace is a name, never fetched (an `xmlns`, or the one a script creates
            // SVG elements in).
            let content = content.replace("\"http://www.w3.org/2000/svg\"", "");
            for off_origin in ["http://", "https://", "src=\"//", "href=\"//", "url(", "@import"] {
                assert!(!content.contains(off_origin), "{name} contains {off_origin:?}: every file is same-origin");
            }
        }
    }

    #[test]
    fn the_pages_hold_no_inline_script_or_style_so_a_strict_csp_allows_them() {
        for (page, html) in pages() {
            for opening in html.match_indices("<script").map(|(at, _)| &html[at..]) {
                let tag = &opening[..opening.find('>').expect("closed tag")];
                assert!(tag.contains(" src=\"/web/"), "{page}: an inline script: {tag}");
                assert!(opening[tag.len() + 1..].starts_with("</script>"), "{page}: a script with a body");
            }
            for inline in ["<style", " style=\"", " onclick=", " onload=", " onsubmit=", "javascript:"] {
                assert!(!html.contains(inline), "{page} contains {inline:?}, which `default-src 'self'` blocks");
            }
        }
    }

    #[test]
    fn the_pages_set_no_cookie_and_keep_identities_in_session_storage() {
        for (name, content) in every_file() {
            assert!(!content.contains("document.cookie"), "{name} touches cookies");
            assert!(!content.contains("localStorage"), "{name}: identities last one tab (sessionStorage), not forever");
        }
        assert!(text(asset("sale.js").expect("sale.js")).contains("sessionStorage"));
        assert!(text(asset("ops.js").expect("ops.js")).contains("sessionStorage"));
    }

    #[test]
    fn the_pages_are_labelled_and_announce_pushed_changes() {
        let sale = text(sale_page());
        assert!(sale.contains("<html lang=\"en\">") && sale.contains("<title>"));
        for region in ["id=\"position\"", "id=\"result\"", "id=\"stock\""] {
            let at = sale.find(region).unwrap_or_else(|| panic!("{region}"));
            let tag = &sale[at..at + sale[at..].find('>').expect("closed")];
            assert!(tag.contains("aria-live="), "{region} changes without a reload: it is a live region");
        }
        let ops = text(ops_page());
        assert!(ops.contains("<label for=\"token\">"), "the token input has a label");
        assert!(ops.contains("<html lang=\"en\">"));
    }

    #[test]
    fn content_types_follow_the_file_kind() {
        assert_eq!(sale_page().content_type, "text/html; charset=utf-8");
        assert_eq!(ops_page().content_type, "text/html; charset=utf-8");
        for name in asset_names() {
            let expected = match name.rsplit('.').next() {
                Some("js") => JAVASCRIPT,
                Some("css") => CSS,
                Some("svg") => SVG,
                other => panic!("{name}: no content type for {other:?}"),
            };
            assert_eq!(asset(name).map(|asset| asset.content_type), Some(expected), "{name}");
        }
    }

    #[test]
    fn unknown_and_crafted_names_are_not_served() {
        for name in ["", "sale.html", "../Cargo.toml", "/sale.js", "sale.js/", "SALE.JS", "src/lib.rs", "sale.js\0"] {
            assert_eq!(asset(name), None, "{name:?}");
        }
    }
}
