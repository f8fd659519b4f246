//! The values that cross between the store and either database: a
//! statement's parameters ([`Param`], the `params!` macro), a row's columns
//! ([`Row`], [`FromCol`]), a one-row query's outcome ([`RowError`],
//! [`OptionalExtension`]), and each database's own types turned into
//! four kinds ([`Value`]: integers, text, bytes and NULL) and back.

use crate::error::Error;

/// A statement's value: what crosses between the store and either
/// database.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Int(i64),
    Text(String),
    Blob(Vec<u8>),
    /// An integer too large for the databases' 64-bit integers: refused
    /// when the statement runs.
    TooLarge(u64),
}

impl Value {
    fn kind(&self) -> &'static str {
        match self {
            Value::Null => "NULL",
            Value::Int(_) => "an integer",
            Value::Text(_) => "text",
            Value::Blob(_) => "bytes",
            Value::TooLarge(_) => "an integer over 2^63",
        }
    }
}

/// What a statement's parameter can be made from.
pub trait Param {
    fn value(&self) -> Value;
}

impl<T: Param + ?Sized> Param for &T {
    fn value(&self) -> Value {
        (**self).value()
    }
}
impl Param for str {
    fn value(&self) -> Value {
        Value::Text(self.to_owned())
    }
}
impl Param for String {
    fn value(&self) -> Value {
        Value::Text(self.clone())
    }
}
impl Param for [u8] {
    fn value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}
impl Param for Vec<u8> {
    fn value(&self) -> Value {
        Value::Blob(self.clone())
    }
}
impl Param for bool {
    fn value(&self) -> Value {
        Value::Int(i64::from(*self))
    }
}
impl Param for Value {
    fn value(&self) -> Value {
        self.clone()
    }
}
impl<T: Param> Param for Option<T> {
    fn value(&self) -> Value {
        self.as_ref().map_or(Value::Null, Param::value)
    }
}
macro_rules! int_param {
    ($($t:ty),*) => {$(
        impl Param for $t {
            fn value(&self) -> Value {
                Value::Int(i64::from(*self))
            }
        }
    )*};
}
int_param!(i64, i32, u32, u16, u8);
impl Param for u64 {
    fn value(&self) -> Value {
        i64::try_from(*self).map_or(Value::TooLarge(*self), Value::Int)
    }
}
impl Param for usize {
    fn value(&self) -> Value {
        (*self as u64).value()
    }
}

/// A statement's parameters, in order (`?1` first).
macro_rules! params {
    () => { [] as [$crate::store::value::Value; 0] };
    ($($x:expr),+ $(,)?) => {
        [$($crate::store::value::Param::value(&$x)),+]
    };
}
pub(crate) use params;

/// A value read from a column.
pub trait FromCol: Sized {
    fn from_col(v: Value) -> Result<Self, String>;
}

impl FromCol for Value {
    fn from_col(v: Value) -> Result<Self, String> {
        Ok(v)
    }
}
impl FromCol for String {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Text(t) => Ok(t),
            other => Err(format!("text expected, {} found", other.kind())),
        }
    }
}
impl FromCol for Vec<u8> {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Blob(b) => Ok(b),
            Value::Text(t) => Ok(t.into_bytes()),
            other => Err(format!("bytes expected, {} found", other.kind())),
        }
    }
}
impl FromCol for bool {
    fn from_col(v: Value) -> Result<Self, String> {
        i64::from_col(v).map(|i| i != 0)
    }
}
impl FromCol for i64 {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Int(i) => Ok(i),
            other => Err(format!("an integer expected, {} found", other.kind())),
        }
    }
}
macro_rules! int_col {
    ($($t:ty),*) => {$(
        impl FromCol for $t {
            fn from_col(v: Value) -> Result<Self, String> {
                let i = i64::from_col(v)?;
                <$t>::try_from(i).map_err(|_| {
                    format!("{i} is out of range for {}", stringify!($t))
                })
            }
        }
    )*};
}
int_col!(u64, u32, i32, u16, u8, usize);
impl<T: FromCol> FromCol for Option<T> {
    fn from_col(v: Value) -> Result<Self, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_col(v).map(Some),
        }
    }
}

/// Something that names a column of a row: its position.
pub trait ColIndex {
    fn index(&self) -> usize;
}
impl ColIndex for usize {
    fn index(&self) -> usize {
        *self
    }
}

/// One row a query returned, its values taken out of the database's own
/// types.
#[derive(Debug)]
pub struct Row {
    pub(super) values: Vec<Value>,
}

impl Row {
    /// Column `idx`, as `T`.
    pub fn get<I: ColIndex, T: FromCol>(&self, idx: I) -> Result<T, Error> {
        let idx = idx.index();
        let v = self
            .values
            .get(idx)
            .cloned()
            .ok_or_else(|| Error::Store(format!("column {idx} is not in the row")))?;
        T::from_col(v).map_err(|e| Error::Store(format!("column {idx}: {e}")))
    }
}

/// A query's outcome when it must return one row: none is its own case.
#[derive(Debug)]
pub enum RowError {
    NoRows,
    Failed(Error),
}

impl From<Error> for RowError {
    fn from(e: Error) -> RowError {
        RowError::Failed(e)
    }
}

impl From<RowError> for Error {
    fn from(e: RowError) -> Error {
        match e {
            RowError::NoRows => Error::Store("the query returned no row".into()),
            RowError::Failed(e) => e,
        }
    }
}

/// A one-row query's outcome read as "none, or this one".
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>, Error>;
}

impl<T> OptionalExtension<T> for Result<T, RowError> {
    fn optional(self) -> Result<Option<T>, Error> {
        match self {
            Ok(t) => Ok(Some(t)),
            Err(RowError::NoRows) => Ok(None),
            Err(RowError::Failed(e)) => Err(e),
        }
    }
}

pub(super) fn check_params(params: &[Value]) -> Result<(), Error> {
    for (i, p) in params.iter().enumerate() {
        if let Value::TooLarge(v) = p {
            return Err(Error::Store(format!(
                "parameter {}: {v} is too large for the store's integers",
                i + 1
            )));
        }
    }
    Ok(())
}

pub(super) fn sqlite_value(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as V;
    match v {
        Value::Null | Value::TooLarge(_) => V::Null,
        Value::Int(i) => V::Integer(*i),
        Value::Text(t) => V::Text(t.clone()),
        Value::Blob(b) => V::Blob(b.clone()),
    }
}

pub(super) fn from_sqlite(v: rusqlite::types::ValueRef<'_>) -> Value {
    use rusqlite::types::ValueRef as V;
    match v {
        V::Null => Value::Null,
        V::Integer(i) => Value::Int(i),
        // No column holds a real; one read as text keeps its value.
        V::Real(r) => Value::Text(r.to_string()),
        V::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        V::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// A [`Value`] as PostgreSQL's parameter of whatever type it inferred.
#[derive(Debug)]
pub(super) struct PgParam<'v>(&'v Value);

impl postgres::types::ToSql for PgParam<'_> {
    fn to_sql(
        &self,
        ty: &postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use postgres::types::{IsNull, Type};
        let mismatch = || -> Box<dyn std::error::Error + Sync + Send> {
            format!("{} given for a parameter of type {ty}", self.0.kind()).into()
        };
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::TooLarge(_) => Err(mismatch()),
            Value::Int(i) => match *ty {
                Type::INT8 => i.to_sql(ty, out),
                Type::INT4 => i32::try_from(*i).map_err(|_| mismatch())?.to_sql(ty, out),
                Type::INT2 => i16::try_from(*i).map_err(|_| mismatch())?.to_sql(ty, out),
                Type::BOOL => (*i != 0).to_sql(ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => i.to_string().to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Text(t) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    t.as_str().to_sql(ty, out)
                }
                Type::BYTEA => t.as_bytes().to_sql(ty, out),
                _ => Err(mismatch()),
            },
            Value::Blob(b) => match *ty {
                Type::BYTEA => b.as_slice().to_sql(ty, out),
                _ => Err(mismatch()),
            },
        }
    }

    fn accepts(_: &postgres::types::Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

pub(super) fn pg_params(params: &[Value]) -> Vec<PgParam<'_>> {
    params.iter().map(PgParam).collect()
}

pub(super) fn pg_refs<'p>(
    params: &'p [PgParam<'_>],
) -> Vec<&'p (dyn postgres::types::ToSql + Sync)> {
    params
        .iter()
        .map(|p| p as &(dyn postgres::types::ToSql + Sync))
        .collect()
}

pub(super) fn from_pg_row(row: &postgres::Row) -> Result<Row, Error> {
    use postgres::types::Type;
    let mut values = Vec::with_capacity(row.len());
    for (i, col) in row.columns().iter().enumerate() {
        let ty = col.type_();
        let v = match *ty {
            Type::INT8 => row.try_get::<_, Option<i64>>(i)?.map(Value::Int),
            Type::INT4 => row
                .try_get::<_, Option<i32>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::INT2 => row
                .try_get::<_, Option<i16>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::BOOL => row
                .try_get::<_, Option<bool>>(i)?
                .map(|v| Value::Int(v.into())),
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                row.try_get::<_, Option<String>>(i)?.map(Value::Text)
            }
            Type::BYTEA => row.try_get::<_, Option<Vec<u8>>>(i)?.map(Value::Blob),
            _ => {
                return Err(Error::Store(format!(
                    "column {} is of type {ty}, which the store does not read",
                    col.name()
                )))
            }
        };
        values.push(v.unwrap_or(Value::Null));
    }
    Ok(Row { values })
}

pub(super) fn parse_word<T>(
    idx: usize,
    text: String,
    parse: impl Fn(&str) -> Option<T>,
) -> Result<T, Error> {
    parse(&text).ok_or_else(|| Error::Store(format!("column {idx}: unknown word {text:?}")))
}

pub(super) fn json_col<T: serde::de::DeserializeOwned>(
    idx: usize,
    text: String,
) -> Result<T, Error> {
    serde_json::from_str(&text).map_err(|e| {
        Error::Store(format!(
            "column {idx}: a stored JSON column does not parse: {e}"
        ))
    })
}
