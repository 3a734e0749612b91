//! Plain-text tables for people: a header line and aligned columns, no borders, so the
//! output also reads well through `grep` and `awk`.

use serde_json::Value;

/// `rows` under `headers`, each column as wide as its widest cell.
pub fn render(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    let mut out = vec![line(headers.to_vec())];
    out.extend(
        rows.iter()
            .map(|row| line(row.iter().map(String::as_str).collect())),
    );
    out.join("\n")
}

/// One row per item of the array `items`, with the cells of `fields` in order.
pub fn rows(items: &Value, fields: &[&str]) -> Vec<Vec<String>> {
    items
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| fields.iter().map(|f| cell(&item[*f])).collect())
        .collect()
}

/// A JSON value as a cell: strings bare, nothing as `-`, anything else as compact JSON.
pub fn cell(value: &Value) -> String {
    match value {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn rows_take_the_named_fields_of_each_item_in_order() {
        let items = json!([{"id": "a", "n": 2}, {"id": "b"}]);
        assert_eq!(
            rows(&items, &["n", "id"]),
            vec![
                vec!["2".to_owned(), "a".into()],
                vec!["-".into(), "b".into()]
            ]
        );
        assert!(rows(&json!({"not": "an array"}), &["id"]).is_empty());
    }

    #[test]
    fn columns_align_to_their_widest_cell() {
        let table = render(
            &["QUEUE", "STATE"],
            &[
                vec!["email".into(), cell(&json!("active"))],
                vec!["reports-monthly".into(), cell(&Value::Null)],
            ],
        );
        assert_eq!(
            table,
            "QUEUE            STATE\nemail            active\nreports-monthly  -"
        );
        assert_eq!(cell(&json!(3)), "3");
        assert_eq!(cell(&json!(["a"])), "[\"a\"]");
    }
}
