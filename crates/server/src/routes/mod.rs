//! Every route of the API, in one table: the router and the OpenAPI document
//! are both built from it, so neither can name a route the other lacks.

mod bodies;
mod feed;
mod groups;
mod indexes;
pub(crate) mod items;
mod search;
mod system;
mod users;

use axum::http::Method;
use axum::routing::{delete, get, patch, post, put, MethodRouter};

use crate::AppState;

/// What a request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// Nothing.
    None,
    /// JSON of the named schema.
    Json(&'static str),
    /// Raw bytes of any content type.
    Bytes,
}

/// What a successful response carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Nothing (204).
    Empty,
    /// JSON of the named schema.
    Json(&'static str),
    /// Raw bytes.
    Bytes,
    /// Prometheus text.
    Text,
}

/// One operation of the API.
pub struct Route {
    /// HTTP method.
    pub method: Method,
    /// Path template in axum's (and OpenAPI's) `{param}` form.
    pub path: &'static str,
    /// OpenAPI `operationId`.
    pub id: &'static str,
    /// One line for humans.
    pub summary: &'static str,
    /// Query parameters: name and meaning.
    pub query: &'static [(&'static str, &'static str)],
    /// Request body.
    pub input: Input,
    /// Success status and body.
    pub ok: (u16, Output),
    /// Whether the operation reads a session token (anonymous allowed or not).
    pub auth: bool,
    /// Builds the handler.
    pub handler: fn() -> MethodRouter<AppState>,
}

const LIST_QUERY: &[(&str, &str)] = &[
    ("kind", "the kind to list; required unless scope=mine"),
    (
        "sort",
        "sort fields, comma-separated, -field for descending; default -modifiedAt",
    ),
    ("limit", "page size, 1 to 1000, default 50"),
    ("cursor", "the next cursor of the previous page"),
    ("scope", "visible (default) or mine"),
    (
        "where.{field}",
        "equality on a where-field of the index; JSON when it parses, else a string",
    ),
];
const PAGE_QUERY: &[(&str, &str)] = &[
    ("limit", "page size, 1 to 1000, default 50"),
    ("cursor", "the next cursor of the previous page"),
];
const KEY_QUERY: &[(&str, &str)] = &[("key", "a link key (or the Tarn-Link-Key header)")];
const SEARCH_QUERY: &[(&str, &str)] = &[
    (
        "q",
        "the words to find (required; at most 1024 bytes and 16 different words)",
    ),
    (
        "kind",
        "the kind searched; without it, every text index without where-fields",
    ),
    (
        "match",
        "all (default): every word; any: at least one, items matching more words first",
    ),
    (
        "prefix",
        "true: the last word also matches words that start with it",
    ),
    ("limit", "page size, 1 to 1000, default 20"),
    ("cursor", "the next cursor of the previous page"),
    (
        "where.{field}",
        "equality on a where-field of the text index",
    ),
];
const CHANGES_QUERY: &[(&str, &str)] = &[
    ("since", "a cursor; without it, the current end"),
    ("kind", "only changes of items of this kind"),
    ("limit", "the most changes returned, 1 to 1000, default 50"),
];
const EVENTS_QUERY: &[(&str, &str)] = &[
    (
        "since",
        "a cursor (or the Last-Event-ID header); without it, from now",
    ),
    ("kind", "only changes of items of this kind"),
];

macro_rules! route {
    ($m:ident $path:literal, $id:literal, $summary:literal, $query:expr, $input:expr, $status:literal $output:expr, $auth:literal, $handler:expr) => {
        Route {
            method: Method::$m,
            path: $path,
            id: $id,
            summary: $summary,
            query: $query,
            input: $input,
            ok: ($status, $output),
            auth: $auth,
            handler: || $handler,
        }
    };
}

/// The table.
pub fn table() -> Vec<Route> {
    use Input as I;
    use Output as O;
    vec![
        route!(GET "/api/v1/health", "health", "Liveness; touches no data", &[], I::None, 200 O::Json("Health"), false, get(system::health)),
        route!(GET "/metrics", "metrics", "Prometheus metrics", &[], I::None, 200 O::Text, false, get(system::metrics)),
        route!(GET "/api/v1/openapi.json", "openapi", "This document", &[], I::None, 200 O::Json("OpenApi"), false, get(system::openapi)),
        route!(POST "/api/v1/users", "createUser", "Sign up (or, admins, create a user)", &[], I::Json("NewUser"), 201 O::Json("User"), true, post(users::create)),
        route!(GET "/api/v1/users/{username}", "getUser", "A user's public profile", &[], I::None, 200 O::Json("PublicUser"), false, get(users::get)),
        route!(POST "/api/v1/sessions", "signIn", "Sign in", &[], I::Json("SignIn"), 201 O::Json("Session"), false, post(users::sign_in)),
        route!(DELETE "/api/v1/sessions/current", "signOut", "End this session on every node", &[], I::None, 204 O::Empty, true, delete(users::sign_out)),
        route!(GET "/api/v1/me", "me", "The caller and all their groups", &[], I::None, 200 O::Json("Me"), true, get(users::me)),
        route!(POST "/api/v1/groups", "createGroup", "Create a group; the caller manages it", &[], I::Json("NewGroup"), 201 O::Json("Group"), true, post(groups::create)),
        route!(GET "/api/v1/groups/{id}", "getGroup", "A group", &[], I::None, 200 O::Json("Group"), true, get(groups::get)),
        route!(GET "/api/v1/groups/{id}/members", "listMembers", "A page of a group's direct members", PAGE_QUERY, I::None, 200 O::Json("MemberPage"), true, get(groups::members)),
        route!(PUT "/api/v1/groups/{id}/members/{principal}", "addMember", "Add a user or group (managers)", &[], I::None, 204 O::Empty, true, put(groups::add_member)),
        route!(DELETE "/api/v1/groups/{id}/members/{principal}", "removeMember", "Remove a member (managers)", &[], I::None, 204 O::Empty, true, delete(groups::remove_member)),
        route!(PUT "/api/v1/groups/{id}/managers/{principal}", "addManager", "Add a manager (managers)", &[], I::None, 204 O::Empty, true, put(groups::add_manager)),
        route!(DELETE "/api/v1/groups/{id}/managers/{principal}", "removeManager", "Remove a manager; one always stays", &[], I::None, 204 O::Empty, true, delete(groups::remove_manager)),
        route!(POST "/api/v1/items", "createItem", "Create an item; the caller manages it", &[], I::Json("NewItem"), 201 O::Json("Item"), true, post(items::create)),
        route!(GET "/api/v1/items", "listItems", "A page of a listing, served by an index", LIST_QUERY, I::None, 200 O::Json("ItemPage"), true, get(items::list)),
        route!(GET "/api/v1/items/{id}", "getItem", "An item", KEY_QUERY, I::None, 200 O::Json("Item"), true, get(items::get)),
        route!(PATCH "/api/v1/items/{id}", "patchItem", "Merge-patch the properties (editors); If-Match honoured", KEY_QUERY, I::Json("ItemPatch"), 200 O::Json("Item"), true, patch(items::patch)),
        route!(DELETE "/api/v1/items/{id}", "deleteItem", "Delete an item with its rows, links and body (managers)", &[], I::None, 204 O::Empty, true, delete(items::delete)),
        route!(PUT "/api/v1/items/{id}/body", "putBody", "Upload the body, streamed (editors)", KEY_QUERY, I::Bytes, 200 O::Json("Item"), true, put(bodies::put)),
        route!(GET "/api/v1/items/{id}/body", "getBody", "Download the body; Range: bytes=a-b answers 206", KEY_QUERY, I::None, 200 O::Bytes, true, get(bodies::get)),
        route!(PUT "/api/v1/items/{id}/acl", "setAcl", "Replace the ACL (managers); it keeps a manager", &[], I::Json("AclBody"), 200 O::Json("Item"), true, put(items::set_acl)),
        route!(POST "/api/v1/items/{id}/links", "createLink", "Make a link key (managers)", &[], I::Json("NewLink"), 201 O::Json("Link"), true, post(items::create_link)),
        route!(DELETE "/api/v1/items/{id}/links/{key}", "deleteLink", "Remove a link key (managers)", &[], I::None, 204 O::Empty, true, delete(items::delete_link)),
        route!(GET "/api/v1/search", "search", "Items the caller may read whose words match, best first", SEARCH_QUERY, I::None, 200 O::Json("SearchPage"), true, get(search::search)),
        route!(GET "/api/v1/changes", "changes", "A page of the changes the caller may see, in commit order", CHANGES_QUERY, I::None, 200 O::Json("ChangePage"), true, get(feed::changes)),
        route!(GET "/api/v1/events", "events", "The changes the caller may see, live (server-sent events)", EVENTS_QUERY, I::None, 200 O::Text, true, get(feed::events)),
        route!(GET "/api/v1/indexes", "listIndexes", "Every index, built-ins included", &[], I::None, 200 O::Json("IndexList"), true, get(indexes::list)),
        route!(PUT "/api/v1/indexes/{name}", "declareIndex", "Declare an index (admins); 201 new, 200 identical", &[], I::Json("IndexDeclaration"), 201 O::Json("Index"), true, put(indexes::put)),
        route!(GET "/api/v1/indexes/{name}", "getIndex", "One index", &[], I::None, 200 O::Json("Index"), true, get(indexes::get)),
        route!(DELETE "/api/v1/indexes/{name}", "dropIndex", "Drop an index and its rows (admins)", &[], I::None, 204 O::Empty, true, delete(indexes::delete)),
    ]
}
