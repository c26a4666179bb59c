//! The responses of the hostile budget search's upstream: a request's usage in one of
//! the providers' shapes, or in none a reader can take.

use super::*;

/// A response reporting `usage` in one of the providers' shapes, sometimes with fields
/// duplicated (the smaller first or last) or written so that they are no usage (a
/// negative count, one beyond 2^64, none at all): then the estimate stands.
pub(super) fn usage_response(r: &mut Rng, usage: u64) -> (Vec<(String, String)>, Vec<u8>) {
    let json = || vec![("content-type".to_string(), "application/json".to_string())];
    let sse = || vec![("content-type".to_string(), "text/event-stream".to_string())];
    let split = |n: u64, r: &mut Rng| {
        let a = r.below(n + 1);
        let b = r.below(n - a + 1);
        (a, b, n - a - b)
    };
    match r.below(9) {
        0 => (json(), format!(r#"{{"id":"x","usage":{{"total_tokens":{usage}}}}}"#).into_bytes()),
        1 => {
            let (input, created, read) = split(usage, r);
            let output = 0;
            (
                json(),
                format!(
                    r#"{{"usage":{{"input_tokens":{input},"cache_creation_input_tokens":{created},"cache_read_input_tokens":{read},"output_tokens":{output}}}}}"#
                )
                .into_bytes(),
            )
        }
        2 => {
            let (input, created, output) = split(usage, r);
            (
                sse(),
                format!(
                    "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"usage\":{{\"input_tokens\":{input},\"cache_creation_input_tokens\":{created},\"output_tokens\":1}}}}}}\n\nevent: message_delta\ndata: {{\"type\":\"message_delta\",\"usage\":{{\"output_tokens\":{output}}}}}\n\n"
                )
                .into_bytes(),
            )
        }
        3 => (
            sse(),
            format!("data: {{\"choices\":[]}}\n\ndata: {{\"choices\":[],\"usage\":{{\"total_tokens\":{usage}}}}}\n\ndata: [DONE]\n\n").into_bytes(),
        ),
        4 => (
            sse(),
            format!("event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"usage\":{{\"total_tokens\":{usage}}}}}}}\n\n").into_bytes(),
        ),
        5 => (json(), format!(r#"{{"usageMetadata":{{"totalTokenCount":{usage}}}}}"#).into_bytes()),
        6 => {
            // The usage named twice, the smaller either way round: the largest is read.
            let smaller = r.below(usage + 1);
            let body = if chance(r, 2) {
                format!(r#"{{"usage":{{"total_tokens":{smaller},"total_tokens":{usage}}}}}"#)
            } else {
                format!(r#"{{"usage":{{"total_tokens":{usage},"total_tokens":{smaller}}}}}"#)
            };
            (json(), body.into_bytes())
        }
        7 => {
            // No usage a reader can take: the estimate stands.
            let odd = ["-5", "1e400", "18446744073709551616", "\"12\"", "null", "1.5"][r.below(6) as usize];
            (json(), format!(r#"{{"usage":{{"total_tokens":{odd}}}}}"#).into_bytes())
        }
        _ => (json(), br#"{"id":"x","choices":[]}"#.to_vec()),
    }
}
