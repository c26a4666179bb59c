//! The top-level `response` settings: what a denied client gets.

use super::{error, header_name, Result};
use crate::config::raw::{RawBody, RawFilterState, RawHeaderStyle, RawResponse};
use crate::field_error::quoted;
use crate::response::{CustomBody, FilterState, HeaderStyle, ResponseSettings};

pub const DEFAULT_STATUS: u16 = 429;
pub const MAX_BODY_BYTES: usize = 4096;

#[inline(never)] // a wasm function of its own: see `compile::compile`
pub(super) fn compile(raw: Option<RawResponse>) -> Result<ResponseSettings> {
    let defaults = ResponseSettings::default();
    let Some(raw) = raw else {
        return Ok(defaults);
    };
    let status = match raw.status {
        None => DEFAULT_STATUS,
        Some(status) => u16::try_from(status)
            .ok()
            .filter(|s| (400..=599).contains(s))
            .ok_or_else(|| {
                error(
                    "response.status",
                    format!("{status} is out of range: expected an error status from 400 to 599"),
                )
            })?,
    };
    let header_style = match raw.header_style {
        None => defaults.header_style,
        Some(RawHeaderStyle::Ietf) => HeaderStyle::Ietf,
        Some(RawHeaderStyle::Legacy) => HeaderStyle::Legacy,
        Some(RawHeaderStyle::None) => HeaderStyle::None,
    };
    let body = raw.body.map(body).transpose()?;
    let shadow_header = raw
        .shadow_header
        .map(|name| {
            header_name(
                &name,
                "response.shadow_header",
                "a response header cannot be a pseudo-header",
            )
        })
        .transpose()?;
    Ok(ResponseSettings {
        status,
        header_style,
        headers_on_allowed: raw
            .headers_on_allowed
            .unwrap_or(defaults.headers_on_allowed),
        body,
        shadow_header,
        filter_state: match raw.filter_state {
            None => defaults.filter_state,
            Some(RawFilterState::Rule) => FilterState::Rule,
            Some(RawFilterState::Denied) => FilterState::Denied,
            Some(RawFilterState::All) => FilterState::All,
            Some(RawFilterState::None) => FilterState::None,
        },
    })
}

fn body(raw: RawBody) -> Result<CustomBody> {
    let at = "response.body.content_type";
    if raw.content_type.is_empty() {
        return Err(error(at, "must not be empty"));
    }
    if raw
        .content_type
        .chars()
        .any(|c| c.is_control() || !c.is_ascii())
    {
        return Err(error(
            at,
            format!(
                "{} is not a valid header value: use printable ASCII",
                quoted(&raw.content_type)
            ),
        ));
    }
    let at = "response.body.text";
    if raw.text.is_empty() {
        return Err(error(at, "must not be empty"));
    }
    if raw.text.len() > MAX_BODY_BYTES {
        return Err(error(
            at,
            format!(
                "{} bytes; at most {MAX_BODY_BYTES} are allowed",
                raw.text.len()
            ),
        ));
    }
    Ok(CustomBody {
        content_type: raw.content_type,
        text: raw.text,
    })
}
