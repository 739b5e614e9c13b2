//! The JSON a safetensors header is: a strict reader (RFC 8259) of one value, bounded in
//! depth, that keeps an object's keys in file order and refuses a key given twice (a
//! reader that kept one of them would load a tensor the file's writer did not mean), and a
//! writer of strings.

use std::fmt::Write as _;

/// Nesting the reader follows: a header is an object of objects of arrays (3).
const MAX_DEPTH: usize = 16;

/// A JSON value. Numbers are kept as written when they are integers (`Int`), and refused
/// otherwise where a header needs one; strings are decoded.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Value {
    Null,
    Bool(bool),
    /// An integer that fits `i128`.
    Int(i128),
    /// Any other number (a fraction or an exponent, or an integer past `i128`).
    Number,
    Str(String),
    Array(Vec<Value>),
    /// Keys in file order, each once.
    Object(Vec<(String, Value)>),
}

impl Value {
    /// What the value is, for messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Int(_) | Value::Number => "a number",
            Value::Str(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }
}

/// Reads `text` as one JSON value followed by nothing but whitespace.
pub(super) fn parse(text: &str) -> Result<Value, String> {
    let mut r = Reader {
        s: text.as_bytes(),
        at: 0,
    };
    r.space();
    let v = r.value(0)?;
    r.space();
    if r.at != r.s.len() {
        return Err(r.error("text after the header's object"));
    }
    Ok(v)
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn error(&self, what: &str) -> String {
        format!("{what} at byte {} of the header", self.at)
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        if self.peek() == Some(b) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.error(&format!("expected '{}'", b as char)))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, String> {
        if depth > MAX_DEPTH {
            return Err(self.error("nesting deeper than a header's"));
        }
        match self.peek() {
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => self.string().map(Value::Str),
            Some(b't') => self.word("true", Value::Bool(true)),
            Some(b'f') => self.word("false", Value::Bool(false)),
            Some(b'n') => self.word("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.error("not a JSON value")),
            None => Err(self.error("the header ends early")),
        }
    }

    fn word(&mut self, w: &str, v: Value) -> Result<Value, String> {
        if self.s[self.at..].starts_with(w.as_bytes()) {
            self.at += w.len();
            Ok(v)
        } else {
            Err(self.error("not a JSON value"))
        }
    }

    fn object(&mut self, depth: usize) -> Result<Value, String> {
        self.expect(b'{')?;
        let mut out: Vec<(String, Value)> = Vec::new();
        self.space();
        if self.peek() == Some(b'}') {
            self.at += 1;
            return Ok(Value::Object(out));
        }
        loop {
            self.space();
            if self.peek() != Some(b'"') {
                return Err(self.error("expected a key"));
            }
            let key = self.string()?;
            if out.iter().any(|(k, _)| *k == key) {
                return Err(format!("the key {key:?} is given twice"));
            }
            self.space();
            self.expect(b':')?;
            self.space();
            let v = self.value(depth + 1)?;
            out.push((key, v));
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b'}') => {
                    self.at += 1;
                    return Ok(Value::Object(out));
                }
                _ => return Err(self.error("expected ',' or '}'")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, String> {
        self.expect(b'[')?;
        let mut out = Vec::new();
        self.space();
        if self.peek() == Some(b']') {
            self.at += 1;
            return Ok(Value::Array(out));
        }
        loop {
            self.space();
            out.push(self.value(depth + 1)?);
            self.space();
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b']') => {
                    self.at += 1;
                    return Ok(Value::Array(out));
                }
                _ => return Err(self.error("expected ',' or ']'")),
            }
        }
    }

    fn number(&mut self) -> Result<Value, String> {
        let start = self.at;
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => {
                while matches!(self.peek(), Some(b'0'..=b'9')) {
                    self.at += 1;
                }
            }
            _ => return Err(self.error("a malformed number")),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            integer = false;
            self.at += 1;
            self.digits()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            integer = false;
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.digits()?;
        }
        let text = std::str::from_utf8(&self.s[start..self.at]).unwrap_or("");
        Ok(match (integer, text.parse::<i128>()) {
            (true, Ok(n)) => Value::Int(n),
            _ => Value::Number,
        })
    }

    fn digits(&mut self) -> Result<(), String> {
        if !matches!(self.peek(), Some(b'0'..=b'9')) {
            return Err(self.error("a malformed number"));
        }
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
        Ok(())
    }

    fn hex4(&mut self) -> Result<u32, String> {
        let digits = self
            .s
            .get(self.at..self.at + 4)
            .ok_or_else(|| self.error("a short \\u escape"))?;
        let text = std::str::from_utf8(digits).map_err(|_| self.error("a bad \\u escape"))?;
        let n = u32::from_str_radix(text, 16).map_err(|_| self.error("a bad \\u escape"))?;
        self.at += 4;
        Ok(n)
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let start = self.at;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.at += 1;
            }
            // The header was checked as UTF-8 whole, and a run stops only at ASCII bytes.
            out.push_str(
                std::str::from_utf8(&self.s[start..self.at])
                    .map_err(|_| self.error("bad UTF-8"))?,
            );
            match self.peek() {
                Some(b'"') => {
                    self.at += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.at += 1;
                    let e = self
                        .peek()
                        .ok_or_else(|| self.error("the header ends early"))?;
                    self.at += 1;
                    match e {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let c = if (0xD800..0xDC00).contains(&hi) {
                                if !self.s[self.at..].starts_with(b"\\u") {
                                    return Err(self.error("a lone surrogate"));
                                }
                                self.at += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.error("a lone surrogate"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else {
                                hi
                            };
                            out.push(
                                char::from_u32(c).ok_or_else(|| self.error("a lone surrogate"))?,
                            );
                        }
                        _ => return Err(self.error("a bad escape")),
                    }
                }
                Some(_) => return Err(self.error("a control character in a string")),
                None => return Err(self.error("the header ends early")),
            }
        }
    }
}

/// `s` as a JSON string (quoted, escaped).
pub(super) fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_as_written_and_malformed_text_is_refused() {
        let v = parse(r#" {"a": [1, -2, 3.5, 1e3], "b": {"c": "x\u00e9\ud83d\ude00\n"}, "d": null, "e": true} "#).unwrap();
        let Value::Object(o) = v else { panic!() };
        assert_eq!(o[0].0, "a");
        assert_eq!(
            o[0].1,
            Value::Array(vec![
                Value::Int(1),
                Value::Int(-2),
                Value::Number,
                Value::Number
            ])
        );
        assert_eq!(
            o[1].1,
            Value::Object(vec![("c".into(), Value::Str("xé😀\n".into()))])
        );
        for bad in [
            "",
            "{",
            "{\"a\":}",
            "{\"a\":1,}",
            "[1,]",
            "{\"a\":1}x",
            "01",
            "-",
            "1.",
            "\"\\ud800\"",
            "\"\\x\"",
            "\"a\nb\"",
            "{\"a\":1,\"a\":2}",
            "tru",
            "{a:1}",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was read");
        }
        let deep = "[".repeat(100) + &"]".repeat(100);
        assert!(parse(&deep).unwrap_err().contains("nesting"));
        assert!(parse("{\"a\":1,\"a\":2}").unwrap_err().contains("twice"));
    }

    #[test]
    fn strings_written_read_back() {
        for s in ["plain", "quote \" back \\ slash", "new\nline\t\u{1}", "é😀"] {
            assert_eq!(parse(&string(s)).unwrap(), Value::Str(s.into()));
        }
    }
}
